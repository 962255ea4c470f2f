package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/app"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/testenv"
)

const (
	dashboardFile  = "../../../deploy/grafana/forkfleet-fleet.json"
	alertRulesFile = "../../../deploy/prometheus/forkfleet-alerts.yml"
	alertTestsFile = "../../../deploy/prometheus/forkfleet-alerts.test.yml"
)

// The alert rules are valid and pass their promtool unit tests.
func TestAlertRules(t *testing.T) {
	promtool := testenv.Tool(t, "promtool")
	for _, args := range [][]string{{"check", "rules", alertRulesFile}, {"test", "rules", alertTestsFile}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "SUCCESS") {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// prometheus is a real Prometheus on loopback scraping one controld every
// second, with forkfleet's alert rules loaded.
type prometheus struct {
	t   *testing.T
	url string
}

func startPrometheus(t *testing.T, metricsAddr string) *prometheus {
	t.Helper()
	bin := testenv.Tool(t, "prometheus")
	rules, err := filepath.Abs(alertRulesFile)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: forkfleet-controld
    static_configs:
      - targets: [%q]
`, rules, metricsAddr)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	// A free loopback port (prometheus cannot report the one it bound).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("prometheus log:\n%s", b)
		}
	})
	p := &prometheus{t: t, url: "http://" + addr}
	p.await("prometheus ready", func() bool {
		resp, err := http.Get(p.url + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	p.await("a successful scrape of controld", func() bool {
		r, err := p.query(`up{job="forkfleet-controld"} == 1`)
		return err == nil && len(r) > 0
	})
	return p
}

func (p *prometheus) await(what string, cond func() bool) {
	p.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			p.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// query runs an instant query through the HTTP API and returns the result
// vector (or an error with Prometheus's message).
func (p *prometheus) query(expr string) ([]json.RawMessage, error) {
	resp, err := http.Get(p.url + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out struct {
		Status    string `json:"status"`
		Error     string `json:"error"`
		ErrorType string `json:"errorType"`
		Data      struct {
			ResultType string            `json:"resultType"`
			Result     []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, err
	}
	if out.Status != "success" {
		return nil, fmt.Errorf("%s: %s", out.ErrorType, out.Error)
	}
	return out.Data.Result, nil
}

// dashboardTarget is one query of one panel.
type dashboardTarget struct {
	panel, refID, expr string
}

func dashboardTargets(t *testing.T) ([]dashboardTarget, []string) {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var out []dashboardTarget
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			out = append(out, dashboardTarget{p.Title, tg.RefID, tg.Expr})
		}
	}
	var vars []string
	for _, v := range d.Templating.List {
		if v.Definition != "" {
			vars = append(vars, v.Definition)
		}
	}
	return out, vars
}

// grafanaVars stands in for what Grafana substitutes before it queries:
// every controld, a rate window a few scrapes wide.
var grafanaVars = strings.NewReplacer(`$__rate_interval`, "30s", `$instance`, ".*")

// checkDashboard runs every query of the dashboard (and of its template
// variables) through p: none may fail, and none may come back empty unless
// mayBeEmpty names its panel (what the run cannot have produced).
func checkDashboard(t *testing.T, p *prometheus, mayBeEmpty map[string]bool) {
	t.Helper()
	targets, vars := dashboardTargets(t)
	if len(targets) < 20 {
		t.Fatalf("the dashboard has %d queries", len(targets))
	}
	for _, tg := range targets {
		expr := grafanaVars.Replace(tg.expr)
		if strings.Contains(expr, "$") {
			t.Errorf("panel %q %s: a template variable the test does not substitute: %s", tg.panel, tg.refID, tg.expr)
			continue
		}
		res, err := p.query(expr)
		switch {
		case err != nil:
			t.Errorf("panel %q %s: %v\n  %s", tg.panel, tg.refID, err, expr)
		case len(res) == 0 && !mayBeEmpty[tg.panel]:
			t.Errorf("panel %q %s: empty result\n  %s", tg.panel, tg.refID, expr)
		default:
			t.Logf("panel %q %s: %d series", tg.panel, tg.refID, len(res))
		}
	}
	// label_values(metric, label) as Grafana runs it: the label's values
	// among the metric's series.
	for _, v := range vars {
		inner, ok := strings.CutPrefix(v, "label_values(")
		metric, label, ok2 := strings.Cut(strings.TrimSuffix(inner, ")"), ",")
		if !ok || !ok2 {
			t.Errorf("template variable %q: not label_values(metric, label)", v)
			continue
		}
		res, err := p.query(fmt.Sprintf("count by (%s) (%s)", strings.TrimSpace(label), metric))
		if err != nil || len(res) == 0 {
			t.Errorf("template variable %q: %d values, %v", v, len(res), err)
		}
	}
	// The alert rules loaded and evaluate without error on real data.
	resp, err := http.Get(p.url + "/api/v1/rules")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rules struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Name      string `json:"name"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&rules); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range rules.Data.Groups {
		for _, r := range g.Rules {
			n++
			if r.Health != "ok" {
				t.Errorf("alert rule %s: health %q %s", r.Name, r.Health, r.LastError)
			}
		}
	}
	if n < 9 {
		t.Errorf("%d alert rules loaded", n)
	}
}

// Every query of deploy/grafana's dashboard, run by a real Prometheus
// scraping controld (the fake runtime) after controld did what each panel
// shows.
func TestDashboardQueries(t *testing.T) {
	d := fakeStack(t)
	p := startPrometheus(t, d.addrs.Metrics)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	exercise(t, ctx, d)
	// A limit reached, for the limits panel: an OOM kill the kernel would
	// have counted.
	l, err := d.sb.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{States: []controldv1.SandboxState{controldv1.SandboxState_SANDBOX_STATE_READY}})
	if err != nil || len(l.Sandboxes) == 0 {
		t.Fatalf("running sandboxes: %v %v", l, err)
	}
	d.rt.SetLimitHits(l.Sandboxes[0].Id, runtime.LimitHits{OOMKills: 1})
	// Rates need two scrapes after the activity; the limit poller a second.
	time.Sleep(4 * time.Second)
	checkDashboard(t, p, nil)
}

// The same on the real stack: controld over containerd, runc and CRIU
// (real boots, a real dump and restore), scraped by a real Prometheus. No
// sandbox here reaches a limit, so that panel may be empty.
func TestRealStackDashboardQueries(t *testing.T) {
	cfg, _, _ := realStackConfig(t, "forkfleet-dashboard-it")
	cfg.Boot.Precreate = 0
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rt := realStackRuntime(t, ctx, cfg, filepath.Join(cfg.StateDir, "runtime"))
	d := startWith(t, cfg, app.Deps{Runtime: rt})
	p := startPrometheus(t, d.addrs.Metrics)
	exercise(t, ctx, d)
	time.Sleep(4 * time.Second)
	checkDashboard(t, p, map[string]bool{"Admission refused and limits reached": true})
	cleanupFleet(t, ctx, d)
}

// cleanupFleet deletes every sandbox, checkpoint and pool controld holds.
func cleanupFleet(t *testing.T, ctx context.Context, d *daemon) {
	t.Helper()
	if l, err := d.pl.ListPools(ctx, &controldv1.ListPoolsRequest{}); err == nil {
		for _, p := range l.Pools {
			if _, err := d.pl.DeletePool(ctx, &controldv1.DeletePoolRequest{Id: p.Id}); err != nil {
				t.Errorf("delete pool %s: %v", p.Id, err)
			}
		}
	}
	if l, err := d.sb.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{}); err == nil {
		for _, s := range l.Sandboxes {
			if _, err := d.sb.DeleteSandbox(ctx, &controldv1.DeleteSandboxRequest{Id: s.Id}); err != nil {
				t.Errorf("delete sandbox %s: %v", s.Id, err)
			}
		}
	}
	if l, err := d.ck.ListCheckpoints(ctx, &controldv1.ListCheckpointsRequest{}); err == nil {
		for _, c := range l.Checkpoints {
			if c.ParentCheckpointId == "" {
				if _, err := d.ck.DeleteCheckpoint(ctx, &controldv1.DeleteCheckpointRequest{Id: c.Id, Cascade: true}); err != nil {
					t.Errorf("delete checkpoint %s: %v", c.Id, err)
				}
			}
		}
	}
}
