package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"

	"github.com/vmihailenco/msgpack/v5"
)

// The write-ahead log makes a batch of changes durable with one sequential
// write and one fdatasync into a file whose blocks already exist, where a
// bbolt commit needs scattered page writes and two syncs. Bolt
// writes every batch to the log first and answers its callers, then
// applies the logged batches to tracker.db in a synced transaction now and
// then (a checkpoint), recording the last applied batch's number there;
// at open, the batches logged after it are applied again.
//
// A record is
//
//	uint32 length of payload, big-endian
//	uint32 CRC-32C of payload
//	payload: msgpack walRecord
//
// Records follow each other from the start of the file; after a
// checkpoint the log starts over at offset 0. Reading stops at the first
// record that is short, fails its checksum or does not carry the next
// batch number, so what remains of older records past the end is never
// read back.

const (
	walSize       = 4 << 20 // the log file's size, zero-filled when made
	walHeaderSize = 8
)

var walCRC = crc32.MakeTable(crc32.Castagnoli)

// walRecord is one logged batch.
type walRecord struct {
	Seq     uint64    `msgpack:"seq"`
	Changes []encoded `msgpack:"changes"`
}

// wal is the log file.
type wal struct {
	f   *os.File
	off int64 // where the next record goes
}

// openWAL opens the log at path, making it (zero-filled, synced) when it
// is missing.
func openWAL(path string) (*wal, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		f, err = makeWAL(path)
	}
	if err != nil {
		return nil, fmt.Errorf("write-ahead log: %w", err)
	}
	return &wal{f: f}, nil
}

func makeWAL(path string) (*os.File, error) {
	tmp := path + ".new"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	zero := make([]byte, 1<<20)
	for off := 0; off < walSize && err == nil; off += len(zero) {
		_, err = f.Write(zero)
	}
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		f.Close()
		os.Remove(tmp)
		return nil, err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		d.Sync()
		d.Close()
	}
	return f, nil
}

// fits reports whether a record of n payload bytes fits after off.
func (w *wal) fits(n int) bool { return w.off+walHeaderSize+int64(n) <= walSize }

// append writes rec at the end of the log and syncs it.
func (w *wal) append(payload []byte) error {
	buf := make([]byte, walHeaderSize+len(payload))
	binary.BigEndian.PutUint32(buf, uint32(len(payload)))
	binary.BigEndian.PutUint32(buf[4:], crc32.Checksum(payload, walCRC))
	copy(buf[walHeaderSize:], payload)
	if _, err := w.f.WriteAt(buf, w.off); err != nil {
		return fmt.Errorf("write-ahead log: %w", err)
	}
	if err := fdatasync(w.f); err != nil {
		return fmt.Errorf("write-ahead log: sync: %w", err)
	}
	w.off += int64(len(buf))
	return nil
}

// records reads the log's chain of records from the start.
func (w *wal) records() ([]walRecord, error) {
	var out []walRecord
	var head [walHeaderSize]byte
	for off := int64(0); off+walHeaderSize <= walSize; {
		if _, err := w.f.ReadAt(head[:], off); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("write-ahead log: %w", err)
		}
		n := int64(binary.BigEndian.Uint32(head[:4]))
		if n == 0 || off+walHeaderSize+n > walSize {
			break
		}
		payload := make([]byte, n)
		if _, err := w.f.ReadAt(payload, off+walHeaderSize); err != nil {
			break
		}
		if crc32.Checksum(payload, walCRC) != binary.BigEndian.Uint32(head[4:]) {
			break
		}
		var rec walRecord
		if err := msgpack.Unmarshal(payload, &rec); err != nil {
			break
		}
		if len(out) > 0 && rec.Seq != out[len(out)-1].Seq+1 {
			break
		}
		out = append(out, rec)
		off += walHeaderSize + n
	}
	return out, nil
}

func (w *wal) close() error { return w.f.Close() }
