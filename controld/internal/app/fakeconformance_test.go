package app_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/controldfake"
	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/errdefs/errgrpc"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// api/controldfake refuses what controld refuses, with the same code,
// field and reason: the same requests to both (controld over the fake
// runtime) answer alike. The rules live once, in api/rules, api/limits and
// api/netpolicy.
func TestFakeFollowsControld(t *testing.T) {
	d := fakeStack(t)
	fake := controldfake.Start(t)
	fconn, err := grpc.NewClient(fake.Target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer fconn.Close()
	type clients struct {
		sb controldv1.SandboxServiceClient
		ck controldv1.CheckpointServiceClient
		pl controldv1.PoolServiceClient
	}
	real := clients{d.sb, d.ck, d.pl}
	fk := clients{controldv1.NewSandboxServiceClient(fconn), controldv1.NewCheckpointServiceClient(fconn), controldv1.NewPoolServiceClient(fconn)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// One live sandbox and pool on each side for the calls that need one.
	live := map[*clients]string{}
	pools := map[*clients]string{}
	for _, c := range []*clients{&real, &fk} {
		cr, err := c.sb.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true, RequestId: "conformance"})
		if err != nil {
			t.Fatal(err)
		}
		live[c] = cr.Sandbox.Id
		p, err := c.pl.CreatePool(ctx, &controldv1.CreatePoolRequest{Source: &controldv1.CreatePoolRequest_Image{Image: controldfake.DefaultImage}, Size: 1})
		if err != nil {
			t.Fatal(err)
		}
		pools[c] = p.Pool.Id
	}
	unknownSb, unknownCk, unknownPl := "sb-aaaaaaaaaaaaaaaa", "ck-aaaaaaaaaaaaaaaa", "pl-aaaaaaaaaaaaaaaa"
	for _, tc := range []struct {
		name string
		call func(c *clients) error
	}{
		{"bad screen", func(c *clients) error {
			_, err := c.sb.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{Screen: &controldv1.Screen{Width: 10, Height: 600}})
			return err
		}},
		{"bad depth", func(c *clients) error {
			_, err := c.sb.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{Screen: &controldv1.Screen{Width: 800, Height: 600, Depth: 12}})
			return err
		}},
		{"bad label", func(c *clients) error {
			_, err := c.sb.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{Labels: map[string]string{"bad key": "x"}})
			return err
		}},
		{"reserved env", func(c *clients) error {
			_, err := c.sb.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{Env: map[string]string{"FORKFLEET_TOKEN": "x"}})
			return err
		}},
		{"ttl too long", func(c *clients) error {
			_, err := c.sb.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{Ttl: durationpb.New(400 * 24 * time.Hour)})
			return err
		}},
		{"memory over the maximum", func(c *clients) error {
			_, err := c.sb.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{Resources: &controldv1.Resources{MemoryBytes: 1 << 50}})
			return err
		}},
		{"bad request id", func(c *clients) error {
			_, err := c.sb.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{RequestId: "has space"})
			return err
		}},
		{"request id reused", func(c *clients) error {
			_, err := c.sb.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{RequestId: "conformance", Labels: map[string]string{"other": "x"}})
			return err
		}},
		{"malformed sandbox id", func(c *clients) error {
			_, err := c.sb.GetSandbox(ctx, &controldv1.GetSandboxRequest{Id: "sb-nope"})
			return err
		}},
		{"unknown sandbox", func(c *clients) error {
			_, err := c.sb.GetSandbox(ctx, &controldv1.GetSandboxRequest{Id: unknownSb})
			return err
		}},
		{"bad state filter", func(c *clients) error {
			_, err := c.sb.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{States: []controldv1.SandboxState{99}})
			return err
		}},
		{"page size", func(c *clients) error {
			_, err := c.sb.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{PageSize: 1001})
			return err
		}},
		{"page token", func(c *clients) error {
			_, err := c.ck.ListCheckpoints(ctx, &controldv1.ListCheckpointsRequest{PageToken: "garbage"})
			return err
		}},
		{"wait timeout", func(c *clients) error {
			_, err := c.sb.WaitSandboxReady(ctx, &controldv1.WaitSandboxReadyRequest{Id: live[c], Timeout: durationpb.New(2 * time.Hour)})
			return err
		}},
		{"extend without ttl", func(c *clients) error {
			_, err := c.sb.ExtendSandbox(ctx, &controldv1.ExtendSandboxRequest{Id: live[c]})
			return err
		}},
		{"extend unknown", func(c *clients) error {
			_, err := c.sb.ExtendSandbox(ctx, &controldv1.ExtendSandboxRequest{Id: unknownSb, Ttl: durationpb.New(time.Hour)})
			return err
		}},
		{"checkpoint bad tier", func(c *clients) error {
			_, err := c.ck.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: live[c], Tier: 9})
			return err
		}},
		{"checkpoint name with id prefix", func(c *clients) error {
			_, err := c.ck.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: live[c], Name: "ck-mine"})
			return err
		}},
		{"fork count", func(c *clients) error {
			_, err := c.ck.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: unknownCk, Count: 65})
			return err
		}},
		{"fork unknown", func(c *clients) error {
			_, err := c.ck.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: unknownCk, Count: 1})
			return err
		}},
		{"fork of a checkpoint and a reference", func(c *clients) error {
			_, err := c.ck.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: unknownCk, CheckpointReference: "registry.test/ck:1", Count: 1})
			return err
		}},
		{"fork of nothing", func(c *clients) error {
			_, err := c.ck.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{Count: 1})
			return err
		}},
		{"fork of a reference with whitespace", func(c *clients) error {
			_, err := c.ck.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointReference: "registry.test/ck :1", Count: 1})
			return err
		}},
		{"pull without reference", func(c *clients) error {
			_, err := c.ck.ImportCheckpoint(ctx, &controldv1.ImportCheckpointRequest{Pull: true})
			return err
		}},
		{"export without reference", func(c *clients) error {
			_, err := c.ck.ExportCheckpoint(ctx, &controldv1.ExportCheckpointRequest{Id: unknownCk})
			return err
		}},
		{"pool without source", func(c *clients) error {
			_, err := c.pl.CreatePool(ctx, &controldv1.CreatePoolRequest{Size: 1})
			return err
		}},
		{"pool size", func(c *clients) error {
			_, err := c.pl.CreatePool(ctx, &controldv1.CreatePoolRequest{Source: &controldv1.CreatePoolRequest_Image{Image: controldfake.DefaultImage}, Size: 65})
			return err
		}},
		{"resize to 0", func(c *clients) error {
			_, err := c.pl.UpdatePool(ctx, &controldv1.UpdatePoolRequest{Id: pools[c], Size: 0})
			return err
		}},
		{"resize unknown", func(c *clients) error {
			_, err := c.pl.UpdatePool(ctx, &controldv1.UpdatePoolRequest{Id: unknownPl, Size: 2})
			return err
		}},
		{"claim by name", func(c *clients) error {
			_, err := c.pl.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: "warm"})
			return err
		}},
		{"watch bad id", func(c *clients) error {
			w, err := c.sb.WatchSandboxes(ctx, &controldv1.WatchSandboxesRequest{Ids: []string{"nope"}})
			if err == nil {
				_, err = w.Recv()
			}
			return err
		}},
		{"recording: max_bytes too small", func(c *clients) error {
			_, err := c.sb.StartRecording(ctx, &controldv1.StartRecordingRequest{SandboxId: live[c], MaxBytes: 1000})
			return err
		}},
		{"recording: unknown sandbox", func(c *clients) error {
			_, err := c.sb.StartRecording(ctx, &controldv1.StartRecordingRequest{SandboxId: unknownSb})
			return err
		}},
		{"recording: bad id", func(c *clients) error {
			_, err := c.sb.StopRecording(ctx, &controldv1.StopRecordingRequest{Id: "sb-aaaaaaaaaaaaaaaa"})
			return err
		}},
		{"recording: unknown", func(c *clients) error {
			_, err := c.sb.GetRecording(ctx, &controldv1.GetRecordingRequest{Id: "rc-aaaaaaaaaaaaaaaa"})
			return err
		}},
		{"recording: export without a format", func(c *clients) error {
			_, err := c.sb.ExportRecording(ctx, &controldv1.ExportRecordingRequest{Id: "rc-aaaaaaaaaaaaaaaa"})
			return err
		}},
		{"recording: frames with an fps", func(c *clients) error {
			_, err := c.sb.ExportRecording(ctx, &controldv1.ExportRecordingRequest{Id: "rc-aaaaaaaaaaaaaaaa",
				Format: controldv1.RecordingExportFormat_RECORDING_EXPORT_FORMAT_FRAMES, Fps: 30})
			return err
		}},
		{"recording: list of a bad sandbox id", func(c *clients) error {
			_, err := c.sb.ListRecordings(ctx, &controldv1.ListRecordingsRequest{SandboxId: "nope"})
			return err
		}},
		{"recording: delete unknown", func(c *clients) error {
			_, err := c.sb.DeleteRecording(ctx, &controldv1.DeleteRecordingRequest{Id: "rc-aaaaaaaaaaaaaaaa"})
			return err
		}},
		{"recording ticket: no file", func(c *clients) error {
			_, err := c.sb.CreateRecordingTicket(ctx, &controldv1.CreateRecordingTicketRequest{Id: "rc-aaaaaaaaaaaaaaaa"})
			return err
		}},
		{"recording ticket: unknown", func(c *clients) error {
			_, err := c.sb.CreateRecordingTicket(ctx, &controldv1.CreateRecordingTicketRequest{Id: "rc-aaaaaaaaaaaaaaaa",
				File: controldv1.RecordingFile_RECORDING_FILE_TRAJECTORY})
			return err
		}},
	} {
		re, fe := errgrpc.FromGRPC(tc.call(&real)), errgrpc.FromGRPC(tc.call(&fk))
		if re == nil || fe == nil {
			t.Errorf("%s: controld %v, fake %v: both must refuse", tc.name, re, fe)
			continue
		}
		if errgrpc.Code(re) != errgrpc.Code(fe) || errdefs.Field(re) != errdefs.Field(fe) || errdefs.Reason(re) != errdefs.Reason(fe) {
			t.Errorf("%s:\n  controld %v (code %v, field %q, reason %q)\n  fake     %v (code %v, field %q, reason %q)", tc.name,
				re, errgrpc.Code(re), errdefs.Field(re), errdefs.Reason(re), fe, errgrpc.Code(fe), errdefs.Field(fe), errdefs.Reason(fe))
		}
	}
	// And what they accept, they answer alike: a request id's repeat.
	for _, c := range []*clients{&real, &fk} {
		again, err := c.sb.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true, RequestId: "conformance"})
		if err != nil || again.Sandbox.Id != live[c] {
			t.Errorf("repeat of a request id: %v %v", again, err)
		}
	}
}
