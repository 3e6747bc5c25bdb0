package tracker

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// s3Store keeps blobs as objects PREFIX/ab/abcd… in an S3-compatible
// bucket (AWS S3, SeaweedFS, Ceph RGW, …), through minio-go. Uploads are
// spooled and hash-checked on local disk first, so a bad upload never
// reaches the bucket. Several trackers may share the bucket.
type s3Store struct {
	c              *minio.Client
	bucket, prefix string
	endpoint       string
	spool          string
}

// openS3Store opens s3://BUCKET[/PREFIX]?endpoint=URL[&region=R]. URL's
// scheme chooses TLS (https, the default, or http); without endpoint it is
// AWS (s3.amazonaws.com). Credentials come from the environment
// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), else the
// AWS shared credentials file, else the instance's or pod's IAM role. The
// bucket must exist; uploads are spooled in spool.
func openS3Store(ctx context.Context, u *url.URL, spool string) (*s3Store, error) {
	spec := "s3://" + u.Host + u.Path
	bucket := u.Host
	if bucket == "" {
		return nil, fmt.Errorf("artifact store %s: no bucket; want s3://BUCKET[/PREFIX]?endpoint=URL", spec)
	}
	q := u.Query()
	for k := range q {
		if k != "endpoint" && k != "region" {
			return nil, fmt.Errorf("artifact store %s: unknown parameter %q (want endpoint, region)", spec, k)
		}
	}
	endpoint := q.Get("endpoint")
	if endpoint == "" {
		endpoint = "https://s3.amazonaws.com"
	}
	if !strings.Contains(endpoint, "://") {
		endpoint = "https://" + endpoint
	}
	eu, err := url.Parse(endpoint)
	if err != nil || (eu.Scheme != "http" && eu.Scheme != "https") || eu.Host == "" || (eu.Path != "" && eu.Path != "/") {
		return nil, fmt.Errorf("artifact store %s: endpoint %q: want http://HOST:PORT or https://HOST[:PORT]", spec, endpoint)
	}
	creds := credentials.NewChainCredentials([]credentials.Provider{
		&credentials.EnvAWS{},
		&credentials.FileAWSCredentials{},
		&credentials.IAM{},
	})
	c, err := minio.New(eu.Host, &minio.Options{Creds: creds, Secure: eu.Scheme == "https", Region: q.Get("region")})
	if err != nil {
		return nil, fmt.Errorf("artifact store %s at %s: %w", spec, endpoint, err)
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ok, err := c.BucketExists(cctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("artifact store %s: reach %s: %w", spec, endpoint, err)
	}
	if !ok {
		return nil, fmt.Errorf("artifact store %s: bucket %q does not exist at %s (create it first)", spec, bucket, endpoint)
	}
	if err := os.MkdirAll(spool, 0o755); err != nil {
		return nil, fmt.Errorf("artifact store %s: spool directory: %w", spec, err)
	}
	return &s3Store{c: c, bucket: bucket, prefix: strings.Trim(u.Path, "/"), endpoint: eu.Host, spool: spool}, nil
}

func (s *s3Store) key(sha string) string { return path.Join(s.prefix, sha[:2], sha) }
func (s *s3Store) spoolDir() string      { return s.spool }

func (s *s3Store) sub(name string) (blobStore, error) {
	c := *s
	c.prefix = path.Join(s.prefix, name)
	return &c, nil
}

func (s *s3Store) String() string {
	return "s3://" + path.Join(s.bucket, s.prefix) + " at " + s.endpoint
}

func (s *s3Store) put(ctx context.Context, sha string, f *os.File, size int64) error {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	_, err := s.c.PutObject(ctx, s.bucket, s.key(sha), f, size, minio.PutObjectOptions{ContentType: "application/octet-stream"})
	if err != nil {
		return fmt.Errorf("put %s: %w", s, err)
	}
	return nil
}

func (s *s3Store) open(ctx context.Context, sha string) (io.ReadCloser, error) {
	// The body is streamed after the request's handler returned (which
	// ends ctx): the object's reads live until Close.
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	obj, err := s.c.GetObject(ctx, s.bucket, s.key(sha), minio.GetObjectOptions{})
	if err == nil {
		_, err = obj.Stat() // GetObject is lazy: this asks for it
	}
	if err != nil {
		if obj != nil {
			obj.Close()
		}
		cancel()
		if minio.ToErrorResponse(err).Code == minio.NoSuchKey {
			return nil, fmt.Errorf("get %s from %s: %w", sha, s, os.ErrNotExist)
		}
		return nil, fmt.Errorf("get %s from %s: %w", sha, s, err)
	}
	return objectReader{obj, cancel}, nil
}

// objectReader is an object being read; Close ends its requests.
type objectReader struct {
	*minio.Object
	cancel context.CancelFunc
}

func (o objectReader) Close() error {
	err := o.Object.Close()
	o.cancel()
	return err
}

func (s *s3Store) remove(ctx context.Context, sha string) error {
	err := s.c.RemoveObject(ctx, s.bucket, s.key(sha), minio.RemoveObjectOptions{})
	if err != nil && minio.ToErrorResponse(err).Code != minio.NoSuchKey {
		return fmt.Errorf("remove %s from %s: %w", sha, s, err)
	}
	return nil
}
