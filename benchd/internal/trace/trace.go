// Package trace wires benchd's OpenTelemetry tracing: OTLP when
// OTEL_EXPORTER_OTLP_ENDPOINT (or the traces-specific variant) is set, else
// a local JSON-lines span file next to the result.
package trace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	oteltrace "go.opentelemetry.io/otel/trace"
)

// TracerName is the instrumentation scope of benchd's spans.
const TracerName = "github.com/forkfleet/forkfleet/benchd"

// Setup installs a tracer provider for one suite run and returns it with a
// shutdown that flushes spans. Where says where spans go, for the log.
type Setup struct {
	Provider *sdktrace.TracerProvider
	Where    string
	file     *os.File
}

// Start configures tracing. localPath is the JSON-lines file used when no
// OTLP endpoint is configured; it must already exist (benchd reserves it).
func Start(ctx context.Context, suite, localPath string) (*Setup, error) {
	res := resource.NewWithAttributes(semconv.SchemaURL,
		semconv.ServiceName("benchd"),
		attribute.String("forkfleet.bench.suite", suite))
	var (
		exp   sdktrace.SpanExporter
		where string
		file  *os.File
		err   error
	)
	endpoint := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if endpoint == "" {
		endpoint = os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	if endpoint != "" {
		proto := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
		if proto == "" {
			proto = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
		}
		// The exporters read the endpoint, headers and TLS settings from the
		// standard environment variables themselves.
		switch proto {
		case "grpc":
			exp, err = otlptracegrpc.New(ctx)
		case "", "http/protobuf":
			exp, err = otlptracehttp.New(ctx)
		default:
			return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: want grpc or http/protobuf", proto)
		}
		where = "otlp " + endpoint
	} else {
		file, err = os.OpenFile(localPath, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return nil, fmt.Errorf("open span file: %w", err)
		}
		exp, err = stdouttrace.New(stdouttrace.WithWriter(file))
		where = localPath
	}
	if err != nil {
		if file != nil {
			file.Close()
		}
		return nil, fmt.Errorf("trace exporter: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithBatcher(exp))
	otel.SetTracerProvider(tp)
	return &Setup{Provider: tp, Where: where, file: file}, nil
}

// Shutdown flushes and closes the exporter.
func (s *Setup) Shutdown(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := s.Provider.Shutdown(ctx)
	if s.file != nil {
		err = errors.Join(err, s.file.Close())
	}
	return err
}

// Tracer returns benchd's tracer from the global provider.
func Tracer() oteltrace.Tracer { return otel.Tracer(TracerName) }
