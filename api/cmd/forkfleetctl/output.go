package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/limits"
)

// emit prints one result: with -o json the message as protojson (the RPC's
// response, so scripts read the API's own field names), otherwise what
// table writes.
func (g *globals) emit(msg proto.Message, table func(w io.Writer)) error {
	if g.output == "json" {
		return g.emitJSON(msg, true)
	}
	tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}

// emitJSON writes msg as JSON, indented or as one line (a stream's events).
func (g *globals) emitJSON(msg proto.Message, indent bool) error {
	opts := protojson.MarshalOptions{}
	if indent {
		opts.Multiline, opts.Indent = true, "  "
	}
	b, err := opts.Marshal(msg)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(g.stdout, "%s\n", b)
	return err
}

// --- tables ---

func sandboxRows(w io.Writer, sbs []*controldv1.Sandbox) {
	fmt.Fprintln(w, "ID\tSTATE\tIMAGE\tCHECKPOINT\tPOOL\tCREATED\tEXPIRES")
	for _, sb := range sbs {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", sb.GetId(), stateName(sb.GetState()), sb.GetImage(),
			dash(sb.GetCheckpointId()), dash(sb.GetPoolId()), stamp(sb.GetCreatedAt().AsTime()), expires(sb))
	}
}

func sandboxDetail(w io.Writer, sb *controldv1.Sandbox, ep *controldv1.Endpoint) {
	row := func(k, format string, args ...any) { fmt.Fprintf(w, "%s\t"+format+"\n", append([]any{k}, args...)...) }
	row("id", "%s", sb.GetId())
	row("state", "%s", stateName(sb.GetState()))
	row("image", "%s", sb.GetImage())
	if s := sb.GetScreen(); s != nil {
		row("screen", "%dx%dx%d", s.GetWidth(), s.GetHeight(), s.GetDepth())
	}
	if sb.GetCheckpointId() != "" {
		row("checkpoint", "%s (generation %d)", sb.GetCheckpointId(), sb.GetGeneration())
	}
	if sb.GetPoolId() != "" {
		row("pool", "%s", sb.GetPoolId())
	}
	row("created", "%s", stamp(sb.GetCreatedAt().AsTime()))
	row("expires", "%s", expires(sb))
	if r := sb.GetResources(); r != nil {
		row("resources", "%s", resourcesText(r))
	}
	row("network", "%s", networkText(sb.GetNetwork()))
	if sb.GetRunAsRoot() {
		row("agent", "root")
	}
	if len(sb.GetLabels()) > 0 {
		row("labels", "%s", labelsText(sb.GetLabels()))
	}
	if sb.GetStatusMessage() != "" {
		row("status", "%s", sb.GetStatusMessage())
	}
	for _, l := range sb.GetLimitsReached() {
		row("limit", "%s x%d: %s", strings.TrimPrefix(l.GetLimit().String(), "SANDBOX_LIMIT_"), l.GetCount(), l.GetMessage())
	}
	if b := waterfall(sb); b != "" {
		row("boot", "%s", b)
	}
	if ep != nil {
		row("aci", "%s", ep.GetUrl())
		row("token", "%s", ep.GetToken())
		if ep.GetUnixPath() != "" {
			row("unix", "%s", ep.GetUnixPath())
		}
	}
}

func checkpointRows(w io.Writer, cks []*controldv1.Checkpoint) {
	fmt.Fprintln(w, "ID\tNAME\tTIER\tSOURCE\tPARENT\tFORKS\tMEMORY\tLAYER\tCREATED")
	for _, ck := range cks {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", ck.GetId(), dash(ck.GetName()), tierName(ck.GetTier()),
			dash(ck.GetSourceSandboxId()), dash(ck.GetParentCheckpointId()), ck.GetLiveForks(),
			mib(ck.GetMemoryBytes()), mib(ck.GetLayerBytes()), stamp(ck.GetCreatedAt().AsTime()))
	}
}

func checkpointDetail(w io.Writer, ck *controldv1.Checkpoint) {
	row := func(k, format string, args ...any) { fmt.Fprintf(w, "%s\t"+format+"\n", append([]any{k}, args...)...) }
	row("id", "%s", ck.GetId())
	row("name", "%s", dash(ck.GetName()))
	row("tier", "%s", tierName(ck.GetTier()))
	row("source", "%s", dash(ck.GetSourceSandboxId()))
	row("parent", "%s", dash(ck.GetParentCheckpointId()))
	row("image", "%s", ck.GetImage())
	row("created", "%s", stamp(ck.GetCreatedAt().AsTime()))
	row("size", "memory %s, layer %s", mib(ck.GetMemoryBytes()), mib(ck.GetLayerBytes()))
	if t := ck.GetTiming(); t != nil {
		row("timing", "source frozen %s, dump %s, layer %s, total %s", ms(t.GetFrozen().AsDuration()),
			ms(t.GetDump().AsDuration()), ms(t.GetLayer().AsDuration()), ms(t.GetTotal().AsDuration()))
	}
	var levels []string
	for _, l := range ck.GetVerifyLevels() {
		levels = append(levels, levelName(l))
	}
	row("verifies", "%s", dash(strings.Join(levels, ", ")))
	row("live forks", "%d", ck.GetLiveForks())
	if len(ck.GetChildIds()) > 0 {
		row("children", "%s", strings.Join(ck.GetChildIds(), " "))
	}
	if len(ck.GetLabels()) > 0 {
		row("labels", "%s", labelsText(ck.GetLabels()))
	}
}

func poolRows(w io.Writer, pls []*controldv1.Pool) {
	fmt.Fprintln(w, "ID\tNAME\tSOURCE\tSIZE\tAVAILABLE\tHITS\tMISSES")
	for _, p := range pls {
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%d\t%d\n", p.GetId(), dash(p.GetName()), poolSource(p), p.GetSize(),
			p.GetAvailable(), p.GetHits(), p.GetMisses())
	}
}

func poolSource(p *controldv1.Pool) string {
	if p.GetCheckpointId() != "" {
		return "checkpoint " + p.GetCheckpointId()
	}
	return "image " + p.GetImage()
}

func replicaRows(w io.Writer, reps []*controldv1.ForkReplica) {
	fmt.Fprintln(w, "#\tSANDBOX\tTOOK\tVERIFIED\tERROR")
	for i, r := range reps {
		var checks []string
		for _, v := range r.GetVerification() {
			mark := "ok"
			if !v.GetOk() {
				mark = "FAILED (" + v.GetDetail() + ")"
			}
			checks = append(checks, levelName(v.GetLevel())+" "+mark)
		}
		errText := ""
		if r.GetErrorCode() != 0 {
			errText = fmt.Sprintf("code %d: %s", r.GetErrorCode(), r.GetErrorMessage())
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\n", i, dash(r.GetSandbox().GetId()), ms(r.GetTook().AsDuration()),
			dash(strings.Join(checks, ", ")), dash(errText))
	}
}

func verifyRows(w io.Writer, res []*controldv1.VerifyResult) {
	fmt.Fprintln(w, "LEVEL\tOK\tTOOK\tDETAIL")
	for _, v := range res {
		fmt.Fprintf(w, "%s\t%t\t%s\t%s\n", levelName(v.GetLevel()), v.GetOk(), ms(v.GetTook().AsDuration()), dash(v.GetDetail()))
	}
}

// pageFooter names the next page's token under a table of one page.
func pageFooter(w io.Writer, next string) {
	if next != "" {
		fmt.Fprintf(w, "\nmore: --page-token %s\n", next)
	}
}

// --- values ---

func waterfall(sb *controldv1.Sandbox) string {
	phases := append([]*controldv1.BootPhase(nil), sb.GetBoot()...)
	sort.SliceStable(phases, func(i, j int) bool { return phases[i].GetAt().AsDuration() < phases[j].GetAt().AsDuration() })
	var parts []string
	for _, p := range phases {
		parts = append(parts, fmt.Sprintf("%s %s", p.GetName(), ms(p.GetAt().AsDuration())))
	}
	return strings.Join(parts, " | ")
}

func resourcesText(r *controldv1.Resources) string {
	s := fmt.Sprintf("memory %s, disk %s, pids %d, cpu weight %d, log %s", limits.FormatBytes(r.GetMemoryBytes()),
		limits.FormatBytes(r.GetDiskBytes()), r.GetPidsMax(), r.GetCpuWeight(), limits.FormatBytes(r.GetLogBytes()))
	if r.GetCpuMillis() > 0 {
		s += fmt.Sprintf(", cpu %dm", r.GetCpuMillis())
	}
	return s
}

func networkText(n *controldv1.Network) string {
	if n.GetMode() != controldv1.NetworkMode_NETWORK_MODE_EGRESS {
		return "none"
	}
	s := "egress"
	for _, r := range n.GetPolicy().GetAllow() {
		s += " allow " + ruleText(r)
	}
	for _, r := range n.GetPolicy().GetDeny() {
		s += " deny " + ruleText(r)
	}
	return s
}

func labelsText(l map[string]string) string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + l[k]
	}
	return strings.Join(parts, ",")
}

func expires(sb *controldv1.Sandbox) string {
	if sb.GetExpiresAt() == nil {
		return "-"
	}
	return stamp(sb.GetExpiresAt().AsTime())
}

func stamp(t time.Time) string {
	if t.IsZero() || t.Unix() == 0 {
		return "-"
	}
	return t.Local().Format(time.DateTime)
}

func stateName(s controldv1.SandboxState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "SANDBOX_STATE_"))
}

func tierName(t controldv1.CheckpointTier) string {
	if t == controldv1.CheckpointTier_CHECKPOINT_TIER_UNSPECIFIED {
		return "memory"
	}
	return strings.ToLower(strings.TrimPrefix(t.String(), "CHECKPOINT_TIER_"))
}

func levelName(l controldv1.VerifyLevel) string {
	return strings.ToLower(strings.TrimPrefix(l.String(), "VERIFY_LEVEL_"))
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
