package main

/*
#include <stdlib.h>
#include "support.h"
*/
import "C"

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unsafe"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// The file API of a session (TVM's upload, download, listdir, remove): a
// remote session's files live in its directory on the daemon, whose
// sandbox refuses names that leave it; a local session's in its own
// temporary directory, which takes plain names only.

// localFile resolves a plain file name of a local session.
func (l *localSession) localFile(name string) (string, error) {
	if err := l.check(); err != nil {
		return "", err
	}
	if name == "" || name != filepath.Base(name) || name == "." || name == ".." {
		return "", badArg("file name %q must be a plain file name", name)
	}
	return filepath.Join(l.dir, name), nil
}

func sessionOf(h C.KilnHandle) (session, error) { return lookup[session](h, "session") }

// sessionCall returns the session h and the context of the cancel handle
// that a file call of the session runs under.
func sessionCall(h, cancel C.KilnHandle) (session, context.Context, error) {
	s, err := sessionOf(h)
	if err != nil {
		return nil, nil, err
	}
	ctx, err := contextOf(cancel)
	if err != nil {
		return nil, nil, err
	}
	return s, ctx, nil
}

//export kiln_session_upload_bytes
func kiln_session_upload_bytes(h C.KilnHandle, data unsafe.Pointer, size C.int64_t, name *C.char, cancel C.KilnHandle) C.int {
	s, ctx, err := sessionCall(h, cancel)
	if err != nil {
		return fail(err, errArgument)
	}
	if size < 0 || (size > 0 && data == nil) {
		return fail(badArg("upload: no data (NULL) or a negative size"), errArgument)
	}
	n := gostr(name)
	if n == "" {
		return fail(badArg("upload: bytes need a target file name"), errArgument)
	}
	b := C.GoBytes(data, C.int(size))
	switch s := s.(type) {
	case *remoteSession:
		if err := s.check(); err != nil {
			return fail(err, errSession)
		}
		if err := s.s.Upload(ctx, n, b); err != nil {
			return fail(err, errSession)
		}
	case *localSession:
		p, err := s.localFile(n)
		if err != nil {
			return fail(err, errArgument)
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			return fail(fmt.Errorf("upload: %w", err), errSession)
		}
	}
	return 0
}

// kiln_session_download returns the file's contents in a malloc'd buffer
// (free it with kiln_string_free).
//
//export kiln_session_download
func kiln_session_download(h C.KilnHandle, name *C.char, cancel C.KilnHandle, out *unsafe.Pointer, size *C.int64_t) C.int {
	s, ctx, err := sessionCall(h, cancel)
	if err != nil {
		return fail(err, errArgument)
	}
	if out == nil || size == nil {
		return fail(badArg("no place for the file (NULL)"), errArgument)
	}
	n := gostr(name)
	var b []byte
	switch s := s.(type) {
	case *remoteSession:
		if err := s.check(); err != nil {
			return fail(err, errSession)
		}
		var buf bytes.Buffer
		if _, err := s.s.Download(ctx, n, &buf); err != nil {
			return fail(err, errSession)
		}
		b = buf.Bytes()
	case *localSession:
		p, err := s.localFile(n)
		if err != nil {
			return fail(err, errArgument)
		}
		if b, err = os.ReadFile(p); err != nil {
			if os.IsNotExist(err) {
				err = fmt.Errorf("download %q: %v: %w", n, err, proto.ErrNotFound)
			}
			return fail(err, errSession)
		}
	}
	*out = C.CBytes(append(b, 0))
	*size = C.int64_t(len(b))
	return 0
}

// kiln_session_listdir returns the JSON list of the session's files, each
// {"name", "size"}.
//
//export kiln_session_listdir
func kiln_session_listdir(h C.KilnHandle, cancel C.KilnHandle, out **C.char) C.int {
	s, ctx, err := sessionCall(h, cancel)
	if err != nil {
		return fail(err, errArgument)
	}
	type entry struct {
		Name string `json:"name"`
		Size int64  `json:"size"`
	}
	list := []entry{}
	switch s := s.(type) {
	case *remoteSession:
		if err := s.check(); err != nil {
			return fail(err, errSession)
		}
		fs, err := s.s.List(ctx)
		if err != nil {
			return fail(err, errSession)
		}
		for _, f := range fs {
			list = append(list, entry{f.Name, f.Size})
		}
	case *localSession:
		if err := s.check(); err != nil {
			return fail(err, errSession)
		}
		ents, err := os.ReadDir(s.dir)
		if err != nil {
			return fail(err, errSession)
		}
		for _, e := range ents {
			if !e.Type().IsRegular() {
				continue // the directories of loaded modules
			}
			if fi, err := e.Info(); err == nil {
				list = append(list, entry{e.Name(), fi.Size()})
			}
		}
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Name < list[j].Name })
	b, _ := json.Marshal(list)
	return outString(out, string(b))
}

//export kiln_session_remove
func kiln_session_remove(h C.KilnHandle, name *C.char, cancel C.KilnHandle) C.int {
	s, ctx, err := sessionCall(h, cancel)
	if err != nil {
		return fail(err, errArgument)
	}
	n := gostr(name)
	switch s := s.(type) {
	case *remoteSession:
		if err := s.check(); err != nil {
			return fail(err, errSession)
		}
		if err := s.s.Remove(ctx, n); err != nil {
			return fail(err, errSession)
		}
	case *localSession:
		p, err := s.localFile(n)
		if err != nil {
			return fail(err, errArgument)
		}
		if err := os.Remove(p); err != nil {
			if os.IsNotExist(err) {
				err = fmt.Errorf("remove %q: %v: %w", n, err, proto.ErrNotFound)
			}
			return fail(err, errSession)
		}
	}
	return 0
}

// kiln_artifact_export writes the artifact at src as dst, in the form
// dst's name asks (TVM's export_library): FILE.so the linked host library,
// FILE.tar the tar export (the library and the artifact), anything else a
// copy of the artifact.
//
//export kiln_artifact_export
func kiln_artifact_export(src, dst *C.char) C.int {
	s, d := gostr(src), gostr(dst)
	a, err := artifact.Load(s)
	if err != nil {
		return fail(badArg("export: %v", err), errArgument)
	}
	var b []byte
	switch {
	case strings.HasSuffix(d, ".so"):
		if b = a.Files[artifact.HostLib]; b == nil {
			return fail(badArg("export %s: the artifact has no %s", d, artifact.HostLib), errArgument)
		}
	case strings.HasSuffix(d, ".tar"):
		var buf bytes.Buffer
		if err := a.WriteTar(&buf); err != nil {
			return fail(err, errInternal)
		}
		b = buf.Bytes()
	default:
		if b, err = a.Bytes(); err != nil {
			return fail(err, errInternal)
		}
	}
	if err := os.WriteFile(d, b, 0o644); err != nil {
		return fail(badArg("export: %v", err), errArgument)
	}
	return 0
}

// kiln_tar_linked returns the linked library of a tar export held in
// memory (TVM's download_linked_module: kiln's tar export carries the host
// library already linked), in a malloc'd buffer.
//
//export kiln_tar_linked
func kiln_tar_linked(data unsafe.Pointer, size C.int64_t, out *unsafe.Pointer, outSize *C.int64_t) C.int {
	if out == nil || outSize == nil || size < 0 || (size > 0 && data == nil) {
		return fail(badArg("kiln_tar_linked: bad arguments (NULL)"), errArgument)
	}
	b := C.GoBytes(data, C.int(size))
	lib, err := artifact.ReadTarEntry(bytes.NewReader(b), artifact.TarLinked)
	if err != nil {
		return fail(badArg("download_linked_module: %v", err), errArgument)
	}
	*out = C.CBytes(append(lib, 0))
	*outSize = C.int64_t(len(lib))
	return 0
}

// kiln_handle_floor makes new handles start above floor. A process forked
// from one that used the library loads a fresh copy of it: the parent's
// handles, which its objects still hold, must never name the child's.
//
//export kiln_handle_floor
func kiln_handle_floor(floor C.uint64_t) C.int {
	handles.Lock()
	handles.next = max(handles.next, uint64(floor))
	handles.Unlock()
	return 0
}

// kiln_handle_next is the last handle issued so far.
//
//export kiln_handle_next
func kiln_handle_next() C.uint64_t {
	handles.RLock()
	defer handles.RUnlock()
	return C.uint64_t(handles.next)
}

// loadExport reads what load_module takes on this machine: a .kiln
// artifact, its tar export, or a bare shared object of kiln's ABI (the .so
// export), which becomes an artifact of its host library alone.
func loadExport(path string) (*artifact.Artifact, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	switch {
	case artifact.IsTar(b):
		return artifact.ReadTar(bytes.NewReader(b))
	case bytes.HasPrefix(b, []byte("\x7fELF")):
		a := artifact.New("cpu", "")
		if err := a.Add(artifact.HostLib, b); err != nil {
			return nil, err
		}
		return a, nil
	}
	a, err := artifact.Read(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return a, nil
}
