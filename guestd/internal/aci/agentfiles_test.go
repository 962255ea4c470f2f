package aci

import (
	"os"
	"path/filepath"
	"testing"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/fscred"
)

// TestAgentFilesActAsTheAgentUser: an agent session's file requests are
// checked as the sandbox's agent user and what it creates is that user's;
// controld's admin session acts as guestd (root).
func TestAgentFilesActAsTheAgentUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (setfsuid)")
	}
	nobody := fscred.Cred{UID: 65534, GID: 65534}
	h := newHarness(t, func(o *Options) { o.AgentFiles = nobody })
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	shared, private := filepath.Join(dir, "shared"), filepath.Join(dir, "private")
	if err := os.Mkdir(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(private, 0o755); err != nil {
		t.Fatal(err)
	}
	put := func(path string) *aciv1.ClientMessage {
		return &aciv1.ClientMessage{Request: &aciv1.ClientMessage_FilePut{FilePut: &aciv1.FilePutRequest{Path: path, Data: []byte("x")}}}
	}
	stat := func(path string) *aciv1.ClientMessage {
		return &aciv1.ClientMessage{Request: &aciv1.ClientMessage_FileStat{FileStat: &aciv1.FileStatRequest{Path: path}}}
	}
	agent, admin := h.session(aciToken), h.session(adminToken)

	call(t, agent, put(filepath.Join(shared, "a")))
	if info := call(t, agent, stat(filepath.Join(shared, "a"))).GetFileStat().GetInfo(); info.GetUid() != 65534 || info.GetGid() != 65534 {
		t.Fatalf("file put by the agent: %v", info)
	}
	wantCode(t, call(t, agent, put(filepath.Join(private, "a"))), aciv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED)
	wantCode(t, call(t, agent, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_FileMkdir{FileMkdir: &aciv1.FileMkdirRequest{
		Path: filepath.Join(private, "d")}}}), aciv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED)
	if err := os.WriteFile(filepath.Join(private, "secret"), []byte("s"), 0o600); err != nil {
		t.Fatal(err)
	}
	wantCode(t, call(t, agent, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_FileGet{FileGet: &aciv1.FileGetRequest{
		Path: filepath.Join(private, "secret")}}}), aciv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED)

	call(t, admin, put(filepath.Join(private, "b")))
	if info := call(t, admin, stat(filepath.Join(private, "b"))).GetFileStat().GetInfo(); info.GetUid() != 0 {
		t.Fatalf("file put by controld's admin session: %v", info)
	}
}
