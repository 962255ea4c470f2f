// Package telemetry sets up controld's traces (OpenTelemetry, exported over
// OTLP/gRPC when an endpoint is configured) and its Prometheus registry.
package telemetry

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	sdkresource "go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Tracing is a tracer provider and its shutdown.
type Tracing struct {
	Provider trace.TracerProvider
	shutdown func(context.Context) error
}

// Shutdown flushes pending spans and stops the exporter.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t.shutdown == nil {
		return nil
	}
	return t.shutdown(ctx)
}

// NewTracing returns a provider exporting to endpoint (host:port or an
// http(s):// URL) over OTLP/gRPC, or a no-op provider when endpoint is empty.
func NewTracing(ctx context.Context, endpoint string, insecure bool, service, version string) (*Tracing, error) {
	if endpoint == "" {
		return &Tracing{Provider: noop.NewTracerProvider()}, nil
	}
	opts := []otlptracegrpc.Option{}
	if strings.Contains(endpoint, "://") {
		u, err := url.Parse(endpoint)
		if err != nil {
			return nil, fmt.Errorf("otlp endpoint %q: %w", endpoint, err)
		}
		opts = append(opts, otlptracegrpc.WithEndpoint(u.Host))
		if u.Scheme == "http" {
			insecure = true
		}
	} else {
		opts = append(opts, otlptracegrpc.WithEndpoint(endpoint))
	}
	if insecure {
		opts = append(opts, otlptracegrpc.WithInsecure())
	}
	// The exporter connects lazily: an unreachable collector costs dropped
	// spans, never a failed start.
	exp, err := otlptracegrpc.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("otlp exporter: %w", err)
	}
	res := sdkresource.NewSchemaless(semconv.ServiceName(service), semconv.ServiceVersion(version))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return &Tracing{Provider: tp, shutdown: tp.Shutdown}, nil
}

// NewRegistry returns a Prometheus registry with the Go and process
// collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}
