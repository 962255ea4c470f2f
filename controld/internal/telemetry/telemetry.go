// Package telemetry sets up controld's traces (OpenTelemetry, exported over
// OTLP when an endpoint is configured) and its Prometheus registry.
package telemetry

import (
	"context"
	"fmt"
	"net/url"
	"runtime"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
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

// OTLP protocols (OTEL_EXPORTER_OTLP_PROTOCOL).
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http/protobuf"
)

// TraceConfig says where traces go. The OTel SDK also reads the standard
// OTEL_* variables this does not name: OTEL_EXPORTER_OTLP[_TRACES]_HEADERS,
// _CERTIFICATE, _CLIENT_CERTIFICATE, _CLIENT_KEY, _COMPRESSION, _TIMEOUT,
// OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER[_ARG],
// OTEL_BSP_*.
type TraceConfig struct {
	// Endpoint of the OTLP collector: "https://host:port" (TLS),
	// "http://host:port" (plaintext) or "host:port" (TLS unless Insecure).
	// Empty: traces off.
	Endpoint string
	// Protocol is ProtocolGRPC (empty) or ProtocolHTTP.
	Protocol string
	// Insecure sends plaintext to an Endpoint without a scheme. An
	// endpoint's scheme decides by itself: https is always TLS.
	Insecure bool
	// ServiceName and Version are service.name and service.version;
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override them.
	ServiceName, Version string
}

// NewTracing returns a provider exporting to cfg.Endpoint over OTLP, or a
// no-op provider when the endpoint is empty.
func NewTracing(ctx context.Context, cfg TraceConfig) (*Tracing, error) {
	if cfg.Endpoint == "" {
		return &Tracing{Provider: noop.NewTracerProvider()}, nil
	}
	var (
		exp *otlptrace.Exporter
		err error
	)
	scheme, hasScheme := "", strings.Contains(cfg.Endpoint, "://")
	if hasScheme {
		u, err := url.Parse(cfg.Endpoint)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("otlp endpoint %q: want https://host:port, http://host:port or host:port", cfg.Endpoint)
		}
		if scheme = u.Scheme; scheme != "http" && scheme != "https" {
			return nil, fmt.Errorf("otlp endpoint %q: scheme %q, want https or http", cfg.Endpoint, scheme)
		}
	}
	// The exporters connect lazily: an unreachable collector costs dropped
	// spans, never a failed start.
	switch cfg.Protocol {
	case "", ProtocolGRPC:
		var opts []otlptracegrpc.Option
		if hasScheme {
			// The scheme sets TLS or plaintext (WithEndpointURL).
			opts = append(opts, otlptracegrpc.WithEndpointURL(cfg.Endpoint))
		} else {
			opts = append(opts, otlptracegrpc.WithEndpoint(cfg.Endpoint))
			if cfg.Insecure {
				opts = append(opts, otlptracegrpc.WithInsecure())
			}
		}
		exp, err = otlptracegrpc.New(ctx, opts...)
	case ProtocolHTTP:
		var opts []otlptracehttp.Option
		if hasScheme {
			// A base URL gets the signal's path, as OTEL_EXPORTER_OTLP_ENDPOINT
			// does; a URL with a path is the traces URL as is.
			u := cfg.Endpoint
			if p, _ := url.Parse(u); p.Path == "" || p.Path == "/" {
				u = strings.TrimSuffix(u, "/") + "/v1/traces"
			}
			opts = append(opts, otlptracehttp.WithEndpointURL(u))
		} else {
			opts = append(opts, otlptracehttp.WithEndpoint(cfg.Endpoint))
			if cfg.Insecure {
				opts = append(opts, otlptracehttp.WithInsecure())
			}
		}
		exp, err = otlptracehttp.New(ctx, opts...)
	default:
		return nil, fmt.Errorf("otlp protocol %q: want %s or %s", cfg.Protocol, ProtocolGRPC, ProtocolHTTP)
	}
	if err != nil {
		return nil, fmt.Errorf("otlp exporter: %w", err)
	}
	// Later sources win: controld's own attributes, then the environment's
	// (OTEL_RESOURCE_ATTRIBUTES, then OTEL_SERVICE_NAME).
	res, err := sdkresource.New(ctx,
		sdkresource.WithAttributes(semconv.ServiceName(cfg.ServiceName), semconv.ServiceVersion(cfg.Version)),
		sdkresource.WithHost(), sdkresource.WithProcessPID(), sdkresource.WithTelemetrySDK(),
		sdkresource.WithFromEnv())
	if err != nil {
		exp.Shutdown(ctx)
		return nil, fmt.Errorf("otel resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return &Tracing{Provider: tp, shutdown: tp.Shutdown}, nil
}

// NewRegistry returns a Prometheus registry with the Go and process
// collectors and forkfleet_controld_build_info{version,goversion} 1.
func NewRegistry(version string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "forkfleet", Subsystem: "controld", Name: "build_info",
		Help:        "controld's version (git describe at build time) and Go version; always 1.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version()},
	})
	build.Set(1)
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), build)
	return reg
}
