package suites

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
)

func TestPeerServesTheACI(t *testing.T) {
	srv := httptest.NewServer(newPeerServer(90000))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := aci.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+aci.DefaultUnixPath, "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := 0; i < 3; i++ {
		r, err := s.Screenshot(ctx, aci.JPEG(80))
		if err != nil {
			t.Fatal(err)
		}
		if len(r.GetData()) != 90000 || r.GetWidth() != 1280 {
			t.Fatalf("reply: %d bytes, %dx%d", len(r.GetData()), r.GetWidth(), r.GetHeight())
		}
	}
	if _, err := s.Ping(ctx, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ListWindows(ctx); err == nil {
		t.Fatal("unsupported request answered")
	}
}

func TestIntList(t *testing.T) {
	var l intList
	if err := l.Set("16, 64,1024"); err != nil || l.String() != "16,64,1024" {
		t.Fatalf("%v %v", l, err)
	}
	for _, bad := range []string{"", "x", "-1", ","} {
		if err := l.Set(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestCPUTime(t *testing.T) {
	end := time.Now().Add(50 * time.Millisecond)
	for time.Now().Before(end) {
	}
	d, err := CPUTime("self")
	if err != nil || d <= 0 {
		t.Fatalf("%v %v", d, err)
	}
	if kb, err := StatusKB("self", "VmRSS"); err != nil || kb == 0 {
		t.Fatalf("%v %v", kb, err)
	}
}
