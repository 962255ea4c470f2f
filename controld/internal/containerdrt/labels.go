//go:build linux

package containerdrt

import (
	"strings"
	"time"

	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// Container labels. Every forkfleet sandbox carries labelSandbox; List and
// Exits only look at containers that do.
const (
	labelSandbox = "forkfleet.sandbox" // "true"
	labelImage   = "forkfleet.image"
	// labelImageDigest is the manifest digest labelImage named when the
	// sandbox (or the source of its checkpoint) booted: checkpoints and
	// their forks are pinned to it.
	labelImageDigest = "forkfleet.image-digest"
	// labelImagePin holds the same digest as a reference containerd's
	// garbage collector follows (from a container, or a checkpoint's
	// committed layer, to the manifest, and from there to its config,
	// layers and unpacked snapshots): an image re-imported under its name
	// leaves the old one's content for as long as a sandbox or a
	// checkpoint still needs it (pinnedImage).
	labelImagePin = "containerd.io/gc.ref.content.forkfleet.image"
	labelScreen   = "forkfleet.screen"
	// labelEnvKeys lists the caller's env keys (comma separated) so a
	// disk-tier fork can strip the source's variables from its spec.
	labelEnvKeys = "forkfleet.env-keys"
	// labelCheckpoint is the checkpoint directory a fork was restored from;
	// labelTier its tier ("memory" or "disk").
	labelCheckpoint = "forkfleet.from-checkpoint"
	labelTier       = "forkfleet.tier"
	// labelLayer is the sandbox's own writable layer (a quota-limited
	// directory under Config.LayersDir; see layers.go), when it has one.
	labelLayer = "forkfleet.layer"
	// labelUserPrefix prefixes the caller's BootSpec.Labels.
	labelUserPrefix = "forkfleet.label/"

	// snapshotLabelGCRoot keeps a committed checkpoint layer from
	// containerd's garbage collector.
	snapshotLabelGCRoot = "containerd.io/gc.root"
	// snapshotLabelCheckpoint marks committed checkpoint layers.
	snapshotLabelCheckpoint = "forkfleet.checkpoint"

	// sandboxFilter selects forkfleet's containers.
	sandboxFilter = `labels."` + labelSandbox + `"==true`
)

func sandboxLabels(spec runtime.BootSpec) map[string]string {
	l := map[string]string{
		labelSandbox: "true",
		labelImage:   spec.Image,
		labelScreen:  screenOf(spec),
	}
	if len(spec.Env) > 0 {
		l[labelEnvKeys] = userEnvKeys(spec.Env)
	}
	for k, v := range spec.Labels {
		l[labelUserPrefix+k] = v
	}
	return l
}

func withImageDigest(l map[string]string, dg string) map[string]string {
	l[labelImageDigest] = dg
	l[labelImagePin] = dg
	return l
}

// checkpointLayerLabels are a committed checkpoint layer's labels: a GC
// root (since created) until DeleteCheckpoint, the checkpoint's source, and
// the pin of its base image (imageDigest "": none recorded).
func checkpointLayerLabels(created time.Time, source, imageDigest string) map[string]string {
	l := map[string]string{
		snapshotLabelGCRoot:     created.UTC().Format(time.RFC3339),
		snapshotLabelCheckpoint: source,
	}
	if imageDigest != "" {
		l[labelImagePin] = imageDigest
	}
	return l
}

// userLabels extracts the caller's labels from a container's labels.
func userLabels(l map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range l {
		if u, ok := strings.CutPrefix(k, labelUserPrefix); ok {
			out[u] = v
		}
	}
	return out
}

func tierName(t runtime.CheckpointTier) string {
	switch t {
	case runtime.TierMemory:
		return "memory"
	case runtime.TierDisk:
		return "disk"
	}
	return ""
}

// Snapshot names of checkpoint layers: prepared (empty, or being filled by
// a Checkpoint or an ImportCheckpoint), then committed.
const (
	checkpointPreparePrefix = "forkfleet-checkpoint-prepare-"
	checkpointLayerPrefix   = "forkfleet-checkpoint-"
)
