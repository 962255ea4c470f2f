package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/forkfleet/forkfleet/api/client"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

func recordingCmd(g *globals) *cobra.Command {
	c := group("recording", "Record sandboxes on controld's host: screencast and ACI trajectory, MP4 and frame exports", "rec", "recordings")
	c.AddCommand(recordingStartCmd(g), recordingStopCmd(g), recordingGetCmd(g), recordingListCmd(g), recordingExportCmd(g), recordingDownloadCmd(g), recordingDeleteCmd(g))
	return c
}

func recordingRows(w io.Writer, rs ...*controldv1.Recording) {
	fmt.Fprintln(w, "ID\tSANDBOX\tSTATE\tFRAMES\tREQUESTS\tBYTES\tSTOP\tDIR")
	for _, r := range rs {
		stop := ""
		if r.GetStopReason() != controldv1.RecordingStopReason_RECORDING_STOP_REASON_UNSPECIFIED {
			stop = enumShort(r.GetStopReason().String(), "RECORDING_STOP_REASON_")
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", r.GetId(), r.GetSandboxId(), enumShort(r.GetState().String(), "RECORDING_STATE_"),
			r.GetFrames(), r.GetRequests(), r.GetBytes(), stop, r.GetDir())
	}
}

func recordingStartCmd(g *globals) *cobra.Command {
	var maxBytes uint64
	cmd := &cobra.Command{
		Use:               "start SANDBOX [--max-bytes N]",
		Short:             "Record a sandbox's screencast and ACI trajectory on controld's host (StartRecording)",
		Args:              usageArgs(cobra.ExactArgs(1)),
		ValidArgsFunction: g.completeSandboxes,
		RunE: func(_ *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			_, rec, err := c.Sandbox(args[0]).StartRecording(g.ctx, maxBytes)
			if err != nil {
				return err
			}
			return g.emit(&controldv1.StartRecordingResponse{Recording: rec}, func(w io.Writer) { recordingRows(w, rec) })
		},
	}
	cmd.Flags().Uint64Var(&maxBytes, "max-bytes", 0, "disk cap of the recording and its exports (1 GiB when 0)")
	return cmd
}

func recordingStopCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:               "stop ID",
		Short:             "Stop a recording; its files stay (StopRecording)",
		Args:              usageArgs(cobra.ExactArgs(1)),
		ValidArgsFunction: g.completeRecordings,
		RunE: func(_ *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			rec, err := c.Recording(args[0]).Stop(g.ctx)
			if err != nil {
				return err
			}
			return g.emit(&controldv1.StopRecordingResponse{Recording: rec}, func(w io.Writer) { recordingRows(w, rec) })
		},
	}
}

func recordingGetCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:               "get ID",
		Short:             "Show a recording (GetRecording)",
		Args:              usageArgs(cobra.ExactArgs(1)),
		ValidArgsFunction: g.completeRecordings,
		RunE: func(_ *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			rec, err := c.Recording(args[0]).Get(g.ctx)
			if err != nil {
				return err
			}
			return g.emit(&controldv1.GetRecordingResponse{Recording: rec}, func(w io.Writer) {
				recordingRows(w, rec)
				if rec.GetStopMessage() != "" {
					fmt.Fprintf(w, "\n%s\n", rec.GetStopMessage())
				}
			})
		},
	}
}

func recordingListCmd(g *globals) *cobra.Command {
	var sandbox string
	cmd := &cobra.Command{
		Use:   "list [--sandbox ID]",
		Short: "List recordings, oldest first (ListRecordings)",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(*cobra.Command, []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			rs, err := c.ListRecordings(g.ctx, sandbox)
			if err != nil {
				return err
			}
			return g.emit(&controldv1.ListRecordingsResponse{Recordings: rs}, func(w io.Writer) { recordingRows(w, rs...) })
		},
	}
	cmd.Flags().StringVar(&sandbox, "sandbox", "", "only this sandbox's recordings")
	_ = cmd.RegisterFlagCompletionFunc("sandbox", g.completeSandboxes)
	return cmd
}

func recordingExportCmd(g *globals) *cobra.Command {
	var format, dst string
	var fps uint32
	cmd := &cobra.Command{
		Use:               "export ID [--format mp4|frames] [--fps N] [--download FILE]",
		Short:             "Render a stopped recording to an MP4 or PNG frames on controld's host (ExportRecording), and download it",
		Args:              usageArgs(cobra.ExactArgs(1)),
		ValidArgsFunction: g.completeRecordings,
		RunE: func(_ *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			r := c.Recording(args[0])
			var resp *controldv1.ExportRecordingResponse
			var file controldv1.RecordingFile
			switch strings.ToLower(format) {
			case "mp4":
				file = controldv1.RecordingFile_RECORDING_FILE_MP4
				resp, err = r.ExportMP4(g.ctx, fps)
			case "frames":
				if fps != 0 {
					return usagef("--fps is for --format mp4")
				}
				file = controldv1.RecordingFile_RECORDING_FILE_FRAMES
				resp, err = r.ExportFrames(g.ctx)
			default:
				return usagef("--format %q: want mp4 or frames", format)
			}
			if err != nil {
				return err
			}
			var n int64
			if dst != "" {
				if n, err = r.Download(g.ctx, file, dst); err != nil {
					return err
				}
			}
			return g.emit(resp, func(w io.Writer) {
				fmt.Fprintf(w, "path\t%s\nbytes\t%d\nframes\t%d\nduration\t%v\n", resp.GetPath(), resp.GetBytes(), resp.GetFrames(),
					resp.GetDuration().AsDuration().Round(time.Millisecond))
				if dst != "" {
					fmt.Fprintf(w, "downloaded\t%s (%d bytes)\n", dst, n)
				}
			})
		},
	}
	cmd.Flags().StringVar(&format, "format", "mp4", "mp4 or frames")
	cmd.Flags().Uint32Var(&fps, "fps", 0, "MP4 frames per second (30 when 0, at most 60)")
	cmd.Flags().StringVar(&dst, "download", "", "also download the export through controld's gateway to this local file (frames: a tar)")
	_ = cmd.RegisterFlagCompletionFunc("format", cobra.FixedCompletions([]string{"mp4", "frames"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// recordingFiles are recording download's --file values.
var recordingFiles = map[string]controldv1.RecordingFile{
	"mp4":        controldv1.RecordingFile_RECORDING_FILE_MP4,
	"frames":     controldv1.RecordingFile_RECORDING_FILE_FRAMES,
	"trajectory": controldv1.RecordingFile_RECORDING_FILE_TRAJECTORY,
	"screencast": controldv1.RecordingFile_RECORDING_FILE_SCREENCAST,
}

func recordingDownloadCmd(g *globals) *cobra.Command {
	var file, dst string
	cmd := &cobra.Command{
		Use:               "download ID --file mp4|frames|trajectory|screencast -o FILE",
		Short:             "Download a file of a stopped recording through controld's gateway (CreateRecordingTicket)",
		Args:              usageArgs(cobra.ExactArgs(1)),
		ValidArgsFunction: g.completeRecordings,
		RunE: func(_ *cobra.Command, args []string) error {
			f, ok := recordingFiles[strings.ToLower(file)]
			if !ok {
				return usagef("--file %q: want mp4, frames, trajectory or screencast", file)
			}
			if dst == "" {
				return usagef("-o FILE is required")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			n, err := c.Recording(args[0]).Download(g.ctx, f, dst)
			if err != nil {
				return err
			}
			st, _ := structpb.NewStruct(map[string]any{"path": dst, "bytes": n})
			return g.emit(st, func(w io.Writer) { fmt.Fprintf(w, "downloaded\t%s (%d bytes)\n", dst, n) })
		},
	}
	cmd.Flags().StringVar(&file, "file", "mp4", "mp4 or frames (an export, made first), trajectory or screencast")
	cmd.Flags().StringVarP(&dst, "output", "o", "", "the local file to write")
	_ = cmd.RegisterFlagCompletionFunc("file", cobra.FixedCompletions([]string{"mp4", "frames", "trajectory", "screencast"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func recordingDeleteCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:               "delete ID",
		Short:             "Remove a stopped recording and its exports (DeleteRecording)",
		Args:              usageArgs(cobra.ExactArgs(1)),
		ValidArgsFunction: g.completeRecordings,
		RunE: func(_ *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.Recording(args[0]).Delete(g.ctx); err != nil {
				return err
			}
			return g.emit(&controldv1.DeleteRecordingResponse{}, func(w io.Writer) { fmt.Fprintf(w, "deleted\t%s\n", args[0]) })
		},
	}
}

func (g *globals) completeRecordings(_ *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	return complete(g, args, func(c *client.Client) ([]*controldv1.Recording, error) { return c.ListRecordings(g.ctx, "") },
		func(r *controldv1.Recording) string {
			return r.GetId() + "\t" + enumShort(r.GetState().String(), "RECORDING_STATE_") + " " + r.GetSandboxId()
		})
}
