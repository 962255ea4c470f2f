//go:build linux

package suites

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

// recordSuite measures what recording a sandbox costs: one episode of
// typing and scrolling into the xterm, the same steps at the same times,
// run three ways on the shared controld: bare (nothing watches), with a
// plain screencast subscriber (the delta stream the recorder consumes,
// read by benchd: the screencast's own cost), and recorded
// (StartRecording: the same stream written to disk by controld plus the
// trajectory of every step). It reports bytes per second on disk, the
// sandbox's CPU (its cgroup: guestd, Xvfb, the apps) and controld's CPU in
// each mode, and exports the recording to MP4, checked by ffprobe.
type recordSuite struct {
	episode time.Duration
	reps    int
	fps     uint
	pidfile string
}

func (*recordSuite) Name() string { return "record" }
func (*recordSuite) Description() string {
	return "a recorded episode of typing and scrolling into the xterm: bytes per second on disk, the sandbox's and controld's CPU while recording vs the same episode bare and with a plain screencast subscriber, and the MP4 export checked by ffprobe (duration, frames)"
}
func (r *recordSuite) Flags(fs *flag.FlagSet) {
	fs.DurationVar(&r.episode, "record-episode", 60*time.Second, "episode length (each mode)")
	fs.IntVar(&r.reps, "record-reps", 1, "episodes per mode, the modes in rotation")
	fs.UintVar(&r.fps, "record-fps", 30, "MP4 export frame rate")
	fs.StringVar(&r.pidfile, "record-controld-pidfile", "/run/forkfleet/controld.pid", "controld's pid file (deploy/controld-up.sh), for its CPU")
}

// Peers: none to install; the plain screencast subscriber of the same run
// is the reference.
func (*recordSuite) Peers() []string { return nil }

func (r *recordSuite) Check(ctx context.Context, env *suiteapi.Env) error {
	if r.episode < 5*time.Second || r.reps < 1 || r.fps < 1 || r.fps > 60 {
		return fmt.Errorf("record: --record-episode must be >= 5s, --record-reps >= 1 and --record-fps 1..60")
	}
	if _, err := exec.LookPath("ffprobe"); err != nil {
		return suiteapi.Skipf("ffprobe (Debian's ffmpeg; deploy/host-setup.sh installs it): %v", err)
	}
	return checkControld(ctx, env)
}

// recordMaxBytes caps each recording of the suite: a minute of typing takes
// about 1 MB; the 1 GiB default may not fit above a busy host's floor.
const recordMaxBytes = 256 << 20

// episodeKeys is what the agent types: shell lines whose output scrolls
// the xterm, a key at a time.
var episodeKeys = []string{"echo recording the typing of an agent", "seq 1 40", "ls -la /usr/bin | head -30", "echo done"}

// runEpisode types and scrolls for d (a key every 80 ms, a wheel scroll
// every 3 s) and returns the steps sent.
func runEpisode(ctx context.Context, s *aci.Session, d time.Duration) (int, error) {
	var keys []*aciv1.Action
	for _, line := range episodeKeys {
		for _, ch := range line {
			keys = append(keys, aci.Type(string(ch)))
		}
		keys = append(keys, aci.Key("Return"))
	}
	tick := time.NewTicker(80 * time.Millisecond)
	defer tick.Stop()
	end := time.Now().Add(d)
	steps := 0
	for i := 0; time.Now().Before(end); i++ {
		select {
		case <-ctx.Done():
			return steps, ctx.Err()
		case <-tick.C:
		}
		a := keys[i%len(keys)]
		if i%37 == 36 { // about every 3 s
			a = aci.Scroll(640, 400, 0, 3-6*(i/37%2))
		}
		r, err := s.Step(ctx, []*aciv1.Action{a}, nil)
		if err != nil {
			return steps, err
		}
		if err := stepErr(r, 1); err != nil {
			return steps, err
		}
		steps++
	}
	return steps, nil
}

// sandboxCPU is the CPU time of a sandbox's cgroup (every process in it).
func sandboxCPU(id string) (time.Duration, error) {
	paths := []string{filepath.Join("/sys/fs/cgroup/cpuacct/forkfleet", id, "cpuacct.usage")}
	more, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/cpuacct/*", id, "cpuacct.usage"))
	for _, p := range append(paths, more...) {
		if b, err := os.ReadFile(p); err == nil {
			ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			return time.Duration(ns), err
		}
	}
	for _, p := range []string{filepath.Join("/sys/fs/cgroup/forkfleet", id, "cpu.stat")} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "usage_usec "); ok {
				us, err := strconv.ParseInt(v, 10, 64)
				return time.Duration(us) * time.Microsecond, err
			}
		}
	}
	return 0, fmt.Errorf("no cpu cgroup found for sandbox %s", id)
}

// cpuWindow measures the sandbox's and controld's CPU over fn, in percent
// of one core.
func cpuWindow(id, controldPid string, fn func() error) (sandbox, controld float64, err error) {
	s0, err := sandboxCPU(id)
	if err != nil {
		return 0, 0, err
	}
	var c0 time.Duration
	if controldPid != "" {
		if c0, err = CPUTime(controldPid); err != nil {
			return 0, 0, err
		}
	}
	t0 := time.Now()
	if err := fn(); err != nil {
		return 0, 0, err
	}
	wall := time.Since(t0)
	s1, err := sandboxCPU(id)
	if err != nil {
		return 0, 0, err
	}
	sandbox = float64(s1-s0) / float64(wall) * 100
	if controldPid != "" {
		c1, err := CPUTime(controldPid)
		if err != nil {
			return 0, 0, err
		}
		controld = float64(c1-c0) / float64(wall) * 100
	}
	return sandbox, controld, nil
}

func (r *recordSuite) Run(ctx context.Context, env *suiteapi.Env) ([]result.Row, error) {
	c, err := dialControld(ctx, env)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	cr, err := c.create(ctx)
	if err != nil {
		return nil, err
	}
	id := cr.GetSandbox().GetId()
	defer c.remove(context.WithoutCancel(ctx), id)
	pid := (&viewSuite{pidfile: r.pidfile}).controldPid(env)
	rc := &recordRun{r: r, env: env, c: c, id: id, ep: cr.GetEndpoint(), pid: pid, cells: map[string]*recordCell{}}
	// The modes in rotation, so the host's drift spreads over all of them.
	for rep := 0; rep < r.reps; rep++ {
		for _, mode := range []string{"bare", "screencast", "recorded"} {
			time.Sleep(2 * time.Second) // the screen settles
			if err := rc.episode(ctx, mode, rep == r.reps-1); err != nil {
				return rc.rows(), fmt.Errorf("%s episode %d: %w", mode, rep+1, err)
			}
		}
	}
	if err := rc.export(ctx); err != nil {
		return rc.rows(), err
	}
	env.Notef("record.sandbox_cpu: the sandbox's cpuacct cgroup (guestd, Xvfb, openbox, the xterm and its shell) over each mode's episode, the same steps (a key every 80 ms, a wheel scroll every ~3 s) through the gateway; record.controld_cpu from /proc/<pid>/stat. Modes, in rotation --record-reps times: bare (nothing watches), screencast (a plain subscriber of benchd's to the stream the recorder consumes: zlib records, 60 fps cap, cursor events, frame hashes), recorded (StartRecording: controld's shared capture written to disk, the agent's connection read for the trajectory)")
	env.Notef("record.disk_bytes_per_s: each recording's bytes (screencast.ffrec, trajectory.jsonl) over its start-to-stop span; record.mp4_*: ExportRecording of the last recording at --record-fps, read back by ffprobe -count_frames")
	return rc.rows(), nil
}

// recordRun is one run's sandbox and the series of each mode.
type recordRun struct {
	r     *recordSuite
	env   *suiteapi.Env
	c     *controld
	id    string
	ep    *controldv1.Endpoint
	pid   string
	cells map[string]*recordCell
	order []string
	last  *controldv1.Recording // kept for the MP4
	mp4   []result.Row
}

// recordCell is a mode's series, in the order first added.
type recordCell struct {
	lbl    map[string]string
	series map[string]*result.Series
	order  []string
}

func (rc *recordRun) add(mode, metric, unit, better string, v float64) {
	cl := rc.cells[mode]
	if cl == nil {
		cl = &recordCell{lbl: labels("system", "forkfleet", "mode", mode, "content", "xterm"), series: map[string]*result.Series{}}
		rc.cells[mode] = cl
		rc.order = append(rc.order, mode)
	}
	s := cl.series[metric]
	if s == nil {
		s = result.NewSeries(metric, unit, cl.lbl)
		s.Baseline, s.Better = mode != "recorded", better
		cl.series[metric] = s
		cl.order = append(cl.order, metric)
	}
	s.Add(v)
}

func (rc *recordRun) rows() []result.Row {
	var out []result.Row
	for _, m := range rc.order {
		cl := rc.cells[m]
		for _, metric := range cl.order {
			out = append(out, cl.series[metric].Row())
		}
	}
	return append(out, rc.mp4...)
}

// episode runs one episode in mode and adds its measurements.
func (rc *recordRun) episode(ctx context.Context, mode string, keep bool) error {
	ep := rc.ep
	var recID string
	if mode == "recorded" {
		start, err := rc.c.sb.StartRecording(ctx, &controldv1.StartRecordingRequest{SandboxId: rc.id, MaxBytes: recordMaxBytes})
		if err != nil {
			return err
		}
		recID = start.GetRecording().GetId()
		defer func() {
			if recID != "" { // not kept: stopped and removed
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
				defer cancel()
				rc.c.sb.StopRecording(dctx, &controldv1.StopRecordingRequest{Id: recID})
				rc.c.sb.DeleteRecording(dctx, &controldv1.DeleteRecordingRequest{Id: recID})
			}
		}()
		// The agent's session opens after the start: its requests go into
		// the trajectory.
		e, err := rc.c.sb.GetSandboxEndpoint(ctx, &controldv1.GetSandboxEndpointRequest{Id: rc.id})
		if err != nil {
			return err
		}
		ep = e.GetEndpoint()
	}
	// Through the gateway in every mode, as a recorded agent goes.
	sess, err := aci.Dial(ctx, ep.GetUrl(), ep.GetToken(), aci.WithClientName("benchd"))
	if err != nil {
		return err
	}
	defer sess.Close()
	var streamBytes, streamFrames int64
	stopWatch := func() {}
	if mode == "screencast" {
		watcher, err := aci.Dial(ctx, ep.GetUrl(), ep.GetToken(), aci.WithClientName("benchd-screencast"),
			aci.WithCapabilities("screencast.zlib"), aci.WithEventBuffer(4096))
		if err != nil {
			return err
		}
		wctx, cancel := context.WithCancel(ctx)
		events := watcher.Events(wctx)
		drained := make(chan struct{})
		go func() {
			defer close(drained)
			for ev := range events {
				if f := ev.GetFrame(); f != nil {
					streamFrames++
					streamBytes += int64(len(f.GetZlibChunk()))
					for _, t := range f.GetTiles() {
						streamBytes += int64(len(t.GetData()))
					}
				}
			}
		}()
		stopWatch = func() { cancel(); watcher.Close(); <-drained }
		defer stopWatch()
		if _, err := watcher.ScreencastStart(ctx, &aciv1.ScreencastStartRequest{Fps: 60, Delta: true, Format: aciv1.ImageFormat_IMAGE_FORMAT_ZLIB_RECORDS,
			Cursor: aciv1.CursorMode_CURSOR_MODE_EVENTS, FrameHashes: true}); err != nil {
			return err
		}
	}
	if mode == "recorded" {
		time.Sleep(time.Second) // the recorder's first keyframe
	}
	var steps int
	sb, cd, err := cpuWindow(rc.id, rc.pid, func() error { var err error; steps, err = runEpisode(ctx, sess, rc.r.episode); return err })
	if err != nil {
		return err
	}
	rc.add(mode, "record.sandbox_cpu", "% of a core", result.BetterLower, sb)
	rc.add(mode, "record.controld_cpu", "% of a core", result.BetterLower, cd)
	switch mode {
	case "screencast":
		stopWatch()
		stopWatch = func() {}
		rc.add(mode, "record.stream_bytes_per_s", "B/s", result.BetterLower, float64(streamBytes)/rc.r.episode.Seconds())
		rc.add(mode, "record.frames", "frames", "", float64(streamFrames))
	case "recorded":
		sess.Close()
		time.Sleep(500 * time.Millisecond)
		stopped, err := rc.c.sb.StopRecording(ctx, &controldv1.StopRecordingRequest{Id: recID})
		if err != nil {
			return err
		}
		rec := stopped.GetRecording()
		dur := rec.GetStoppedAt().AsTime().Sub(rec.GetStartedAt().AsTime())
		rc.add(mode, "record.disk_bytes_per_s", "B/s", result.BetterLower, float64(rec.GetBytes())/dur.Seconds())
		rc.add(mode, "record.frames", "frames", "", float64(rec.GetFrames()))
		rc.add(mode, "record.frames_skipped", "frames", result.BetterLower, float64(rec.GetFramesSkipped()))
		lines, err := countLines(filepath.Join(rec.GetDir(), "trajectory.jsonl"))
		if err != nil {
			return err
		}
		// Every step plus the session's hello is a line.
		if lines != steps+1 {
			return fmt.Errorf("the trajectory has %d lines for %d steps and a hello", lines, steps)
		}
		rc.add(mode, "record.trajectory_lines", "lines", "", float64(lines))
		if keep {
			rc.last, recID = rec, ""
		}
		rc.env.Progressf("record: recorded episode: sandbox %.1f%%, controld %.1f%%, %d bytes on disk, %d frames, %d lines", sb, cd, rec.GetBytes(), rec.GetFrames(), lines)
		return nil
	}
	rc.env.Progressf("record: %s episode: sandbox %.1f%%, controld %.1f%% of a core", mode, sb, cd)
	return nil
}

// export renders the last recording to MP4 and checks it with ffprobe.
func (rc *recordRun) export(ctx context.Context) error {
	rec := rc.last
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		rc.c.sb.DeleteRecording(dctx, &controldv1.DeleteRecordingRequest{Id: rec.GetId()})
	}()
	lbl := labels("system", "forkfleet", "mode", "recorded", "content", "xterm")
	single := func(metric, unit, better string, v float64) {
		row := result.Single(metric, unit, lbl, v)
		row.Better = better
		rc.mp4 = append(rc.mp4, row)
	}
	t0 := time.Now()
	mp4, err := rc.c.sb.ExportRecording(ctx, &controldv1.ExportRecordingRequest{Id: rec.GetId(), Format: controldv1.RecordingExportFormat_RECORDING_EXPORT_FORMAT_MP4, Fps: uint32(rc.r.fps)})
	if err != nil {
		return err
	}
	single("record.mp4_export_s", "s", result.BetterLower, time.Since(t0).Seconds())
	single("record.mp4_bytes", "bytes", result.BetterLower, float64(mp4.GetBytes()))
	frames, probed, err := probeMP4(mp4.GetPath())
	if err != nil {
		return err
	}
	want := mp4.GetDuration().AsDuration().Seconds()
	if frames != int(mp4.GetFrames()) || math.Abs(probed-want) > 0.1 {
		return fmt.Errorf("ffprobe: %d frames %.3fs; the export wrote %d frames %.3fs", frames, probed, mp4.GetFrames(), want)
	}
	single("record.mp4_duration_s", "s", "", probed)
	single("record.recording_duration_s", "s", "", rec.GetStoppedAt().AsTime().Sub(rec.GetStartedAt().AsTime()).Seconds())
	single("record.mp4_frames", "frames", "", float64(frames))
	return nil
}

func countLines(path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 4<<20)
	n := 0
	for sc.Scan() {
		n++
	}
	return n, sc.Err()
}

// probeMP4 is what ffprobe decodes of an MP4: frames and duration.
func probeMP4(path string) (int, float64, error) {
	out, err := exec.Command("ffprobe", "-v", "error", "-select_streams", "v:0", "-count_frames",
		"-show_entries", "stream=nb_read_frames,duration", "-of", "json", path).Output()
	if err != nil {
		return 0, 0, fmt.Errorf("ffprobe %s: %w", path, err)
	}
	var p struct {
		Streams []struct {
			Frames   string `json:"nb_read_frames"`
			Duration string `json:"duration"`
		} `json:"streams"`
	}
	if err := json.Unmarshal(out, &p); err != nil || len(p.Streams) != 1 {
		return 0, 0, fmt.Errorf("ffprobe %s: %s", path, out)
	}
	n, err := strconv.Atoi(p.Streams[0].Frames)
	if err != nil {
		return 0, 0, err
	}
	d, err := strconv.ParseFloat(p.Streams[0].Duration, 64)
	return n, d, err
}
