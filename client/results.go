package client

import (
	"context"
	"fmt"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// RecordResult stores a timing in the tracker's results store, owned by
// this connection's user, and returns it as stored (with its ID, owner
// and time of recording).
func (t *Tracker) RecordResult(ctx context.Context, r proto.Result) (proto.Result, error) {
	var out proto.Result
	if err := t.call(ctx, proto.MethodResultRecord, proto.ResultRecordArgs{Result: r}, &out); err != nil {
		return out, fmt.Errorf("record result of %q: %w", r.Function, err)
	}
	return out, nil
}

// ListResults returns the results this user may see that pass a's
// filters, newest first, and how many matched in all.
func (t *Tracker) ListResults(ctx context.Context, a proto.ResultListArgs) (proto.ResultList, error) {
	var out proto.ResultList
	if err := t.call(ctx, proto.MethodResultList, a, &out); err != nil {
		return out, fmt.Errorf("list results: %w", err)
	}
	return out, nil
}

// GetResult returns one result; one that does not exist, or that this
// user may not see, is an error wrapping proto.ErrNotFound.
func (t *Tracker) GetResult(ctx context.Context, id string) (proto.Result, error) {
	var out proto.Result
	if err := t.call(ctx, proto.MethodResultGet, proto.ResultGetArgs{ID: id}, &out); err != nil {
		return out, fmt.Errorf("result %s: %w", id, err)
	}
	return out, nil
}
