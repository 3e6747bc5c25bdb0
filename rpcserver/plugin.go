package rpcserver

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/rpcserver/globals"
)

// EnvWorkerPluginFDs lists the descriptors of the board's plugin
// libraries (Config.Plugins), separated by commas; the worker registers
// their functions as globals before it serves the session.
const EnvWorkerPluginFDs = "KILN_RPC_WORKER_PLUGIN_FDS"

// openPlugins opens the plugin libraries read-only, checking that each is
// an ELF shared object (the worker loads it; the daemon never runs its
// code).
func openPlugins(paths []string) ([]*os.File, error) {
	var out []*os.File
	for _, p := range paths {
		abs, err := filepath.Abs(p)
		if err == nil {
			var f *os.File
			if f, err = os.Open(abs); err == nil {
				var magic [4]byte
				if _, rerr := f.ReadAt(magic[:], 0); rerr != nil || !bytes.Equal(magic[:], []byte("\x7fELF")) {
					f.Close()
					err = fmt.Errorf("not a shared object (an ELF file)")
				} else {
					out = append(out, f)
				}
			}
		}
		if err != nil {
			closePlugins(out)
			return nil, fmt.Errorf("rpcserver: plugin %q: %w", p, err)
		}
	}
	return out, nil
}

func closePlugins(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// loadPlugins registers the functions of the plugins the daemon passed
// (EnvWorkerPluginFDs) as globals.
func loadPlugins(list string) ([]string, error) {
	if list == "" {
		return nil, nil
	}
	var names []string
	for _, v := range strings.Split(list, ",") {
		fd, err := strconv.Atoi(v)
		if err != nil || fd < 3 {
			return nil, fmt.Errorf("bad plugin descriptor %q in %s", v, EnvWorkerPluginFDs)
		}
		n, err := globals.LoadPlugin("/proc/self/fd/" + v)
		if err != nil {
			return nil, err
		}
		names = append(names, n...)
	}
	return names, nil
}
