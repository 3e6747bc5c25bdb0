package main

/*
#include "support.h"
*/
import "C"

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// recordArgs is what kiln_session_record_result takes: a timing taken in
// the session and how to record it.
type recordArgs struct {
	Function string           `json:"function"`
	Time     proto.TimeResult `json:"time"`
	Label    string           `json:"label"`
	Shared   bool             `json:"shared"`
	Inputs   []string         `json:"inputs"`
	Artifact string           `json:"artifact"`
	Target   string           `json:"target"`
	Source   string           `json:"source"`
}

// recordTimeout bounds the recording of one result.
const recordTimeout = 30 * time.Second

// kiln_session_record_result records a timing taken in a session that a
// tracker leased (kiln_tracker_request) in that tracker's results store,
// with the lease's device, and returns the result as stored (its id,
// owner, time of recording) as JSON.
//
//export kiln_session_record_result
func kiln_session_record_result(h C.KilnHandle, argsJSON *C.char, out **C.char) C.int {
	if out == nil {
		return fail(badArg("no place for the result (NULL)"), errArgument)
	}
	r, err := lookup[*remoteSession](h, "session")
	if err != nil {
		return fail(err, errArgument)
	}
	if r.lease == nil {
		return fail(badArg("record result: the session on %s was not leased from a tracker (kiln.rpc.connect_tracker(...).request(...)): there is no results store to record to", r.addr), errArgument)
	}
	var a recordArgs
	dec := json.NewDecoder(strings.NewReader(gostr(argsJSON)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return fail(badArg("record result: %v", err), errArgument)
	}
	if a.Function == "" {
		return fail(badArg("record result: no function name"), errArgument)
	}
	if len(a.Label) > proto.MaxResultLabel {
		return fail(badArg("record result: label of %d bytes, at most %d", len(a.Label), proto.MaxResultLabel), errArgument)
	}
	rec := client.Recording{
		Tracker: r.lease.Tracker(), Lease: r.lease, Label: a.Label, Shared: a.Shared,
		Artifact: a.Artifact, Target: a.Target, Inputs: a.Inputs, Source: a.Source,
	}
	ctx, cancel := context.WithTimeout(context.Background(), recordTimeout)
	defer cancel()
	stored, err := rec.Tracker.RecordResult(ctx, rec.Result(a.Function, a.Time))
	if err != nil {
		return fail(fmt.Errorf("record result on %s: %w", r.addr, err), errTracker)
	}
	b, err := json.Marshal(stored)
	if err != nil {
		return fail(err, errInternal)
	}
	return outString(out, string(b))
}
