package kubernetes

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

// APIServerBin is where `make kube-apiserver` (apiserver/build.sh) keeps the
// kube-apiserver built from Go modules, with its embedded etcd.
const APIServerBin = "/var/cache/forkfleet/kube-apiserver/bin/kube-apiserver"

// fieldManager names the dry runs' applier in managedFields.
const fieldManager = "forkfleet-dry-run"

// TestServerDryRun applies every manifest, as `kubectl apply --server-side
// --dry-run=server --validate=strict` does, to a real kube-apiserver (with
// etcd, on loopback): the API server's own decoding, defaulting, validation
// and admission (Pod Security among them) run, and nothing is stored. Any
// error or warning fails. The namespace alone is then created for real: the
// namespaced objects' admission reads its labels (a privileged DaemonSet is
// admitted only in a namespace that allows it).
func TestServerDryRun(t *testing.T) {
	if os.Getenv("FORKFLEET_INTEGRATION") != "1" {
		t.Skip("needs a kube-apiserver (make kube-apiserver) and FORKFLEET_INTEGRATION=1")
	}
	if _, err := os.Stat(APIServerBin); err != nil {
		t.Fatalf("kube-apiserver not built (make kube-apiserver): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cfg, warnings := startAPIServer(t, ctx)
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))

	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("manifests: %v %v", files, err)
	}
	// The namespace first: every other object lives in it.
	files = append([]string{"namespace.yaml"}, slices.DeleteFunc(files, func(f string) bool { return f == "namespace.yaml" })...)
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		res, obj := resourceOf(t, mapper, dyn, f, raw)
		warnings.take()
		out, err := apply(ctx, res, obj.GetName(), raw, true)
		if w := warnings.take(); len(w) > 0 {
			t.Errorf("%s: warnings from the API server: %q", f, w)
		}
		if err != nil {
			t.Errorf("%s: server-side dry run: %v", f, err)
			continue
		}
		t.Logf("%s: %s %s/%s: dry run admitted; %d fields sent, %d in the answer (the server's defaults and metadata)",
			f, out.GetKind(), out.GetNamespace(), out.GetName(), leaves(obj.Object), leaves(out.Object))
		if obj.GetKind() == "Namespace" {
			if _, err := apply(ctx, res, obj.GetName(), raw, false); err != nil {
				t.Fatalf("%s: create: %v", f, err)
			}
		} else if _, err := res.Get(ctx, obj.GetName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("%s: stored by a dry run (get: %v)", f, err)
		}
	}

	// Strict field validation is on: a field the API does not know is an
	// error, not a warning the dry run would pass.
	raw, err := os.ReadFile("daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Replace(raw, []byte("\nspec:\n"), []byte("\nspec:\n  notAField: 1\n"), 1)
	res, obj := resourceOf(t, mapper, dyn, "daemonset.yaml", bad)
	if _, err := apply(ctx, res, obj.GetName(), bad, true); err == nil || !strings.Contains(err.Error(), "notAField") {
		t.Errorf("a DaemonSet with an unknown field: %v, want a strict decoding error", err)
	}
	warnings.take()
}

// apply sends raw as a server-side apply patch, dry run or not, with strict
// field validation.
func apply(ctx context.Context, res dynamic.ResourceInterface, name string, raw []byte, dryRun bool) (*unstructured.Unstructured, error) {
	force := true
	opts := metav1.PatchOptions{FieldManager: fieldManager, Force: &force, FieldValidation: metav1.FieldValidationStrict}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	return res.Patch(ctx, name, types.ApplyYAMLPatchType, raw, opts)
}

// resourceOf is the API resource (namespaced or not, as discovery says) of
// the object in raw.
func resourceOf(t *testing.T, mapper meta.RESTMapper, dyn dynamic.Interface, file string, raw []byte) (dynamic.ResourceInterface, *unstructured.Unstructured) {
	t.Helper()
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(raw, &obj.Object); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	gvk := obj.GroupVersionKind()
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Fatalf("%s: %s: %v", file, gvk, err)
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return dyn.Resource(m.Resource).Namespace(obj.GetNamespace()), obj
	}
	return dyn.Resource(m.Resource), obj
}

// leaves counts an object's scalar fields: the dry run's answer has the
// server's defaults (and metadata) on top of the manifest's.
func leaves(v any) int {
	switch v := v.(type) {
	case map[string]any:
		n := 0
		for _, e := range v {
			n += leaves(e)
		}
		return n
	case []any:
		n := 0
		for _, e := range v {
			n += leaves(e)
		}
		return n
	default:
		return 1
	}
}

// warningSink keeps the API server's warnings (deprecations, Pod Security,
// unknown fields under a non-strict validation) for the test to fail on.
type warningSink struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warningSink) HandleWarningHeader(code int, agent, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, text)
}

func (w *warningSink) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.msgs
	w.msgs = nil
	return m
}

// startAPIServer runs APIServerBin in a directory of the test's and returns
// a client configuration for it once it is ready. The server is stopped
// (SIGTERM, then killed) when the test ends; its log is printed if the test
// failed.
func startAPIServer(t *testing.T, ctx context.Context) (*rest.Config, *warningSink) {
	t.Helper()
	dir := t.TempDir()
	logPath := filepath.Join(dir, "kube-apiserver.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	if v, err := exec.Command(APIServerBin, "-version").Output(); err == nil {
		t.Logf("%s", bytes.TrimSpace(v))
	}
	cmd := exec.Command(APIServerBin, "-dir", filepath.Join(dir, "state"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("kube-apiserver log:\n%s", tail(b, 60))
		}
	})

	kubeconfig := filepath.Join(dir, "state", "kubeconfig")
	start := time.Now()
	for {
		if _, err := os.Stat(kubeconfig); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("kube-apiserver exited before it was ready: %v", err)
		case <-ctx.Done():
			t.Fatalf("kube-apiserver not ready: %v", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Logf("kube-apiserver and etcd ready in %v", time.Since(start).Round(time.Millisecond))
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	w := &warningSink{}
	cfg.WarningHandler = w
	return cfg, w
}

func tail(b []byte, n int) []byte {
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return bytes.Join(lines, []byte("\n"))
}
