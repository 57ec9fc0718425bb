package labbench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"kuport.wlz.li/kuport/lab"
)

// ControllerProfile reads the first controller replica's /debug/pprof/<query> (the lab
// starts it with --pprof when a bench asks for profiles).
func ControllerProfile(query string) func() (io.ReadCloser, error) {
	return func() (io.ReadCloser, error) {
		resp, err := http.Get("http://" + lab.ReplicaHTTPAddr(0) + "/debug/pprof/" + query)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			_ = resp.Body.Close()
			return nil, fmt.Errorf("%s", resp.Status)
		}
		return resp.Body, nil
	}
}

// APIServerCPUProfile reads kube-apiserver's CPU profile over the next seconds (the lab
// starts it with --profiling when a bench asks for profiles).
func APIServerCPUProfile(ctx context.Context, l *lab.Lab, seconds int) func() (io.ReadCloser, error) {
	return func() (io.ReadCloser, error) {
		return l.Kube.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
			Param("seconds", strconv.Itoa(seconds)).Timeout(time.Duration(seconds+30) * time.Second).Stream(ctx)
	}
}

// SaveProfile writes what read returns to dir/file; a failure is logged, not the bench's.
func SaveProfile(log hclog.Logger, dir, file string, read func() (io.ReadCloser, error)) {
	err := func() error {
		body, err := read()
		if err != nil {
			return err
		}
		defer func() { _ = body.Close() }()
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		out, err := os.Create(filepath.Join(dir, file))
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, body); err != nil {
			_ = out.Close()
			return err
		}
		return out.Close()
	}()
	if err != nil {
		log.Warn("profile", "file", file, "error", err)
		return
	}
	log.Info("profile written", "file", filepath.Join(dir, file))
}

// ProfileFrom starts kube-apiserver's CPU profile over the next seconds, written to
// dir/apiserverFile, and the controller's, written to dir/controllerFile unless that is "",
// and returns once they have begun; the function it returns waits for them to be written.
func ProfileFrom(ctx context.Context, log hclog.Logger, l *lab.Lab, dir string, seconds int, apiserverFile, controllerFile string) (wait func()) {
	var wg sync.WaitGroup
	wg.Go(func() { SaveProfile(log, dir, apiserverFile, APIServerCPUProfile(ctx, l, seconds)) })
	if controllerFile != "" {
		wg.Go(func() {
			SaveProfile(log, dir, controllerFile, ControllerProfile(fmt.Sprintf("profile?seconds=%d", seconds)))
		})
	}
	time.Sleep(100 * time.Millisecond) // the profiles run before what they are taken over
	return wg.Wait
}
