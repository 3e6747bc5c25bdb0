package tracker

import (
	"crypto/tls"
	"errors"
	"log/slog"
	"time"
)

// Config configures a tracker. Zero fields take the defaults named.
type Config struct {
	// Listen is the kiln protocol address (default "127.0.0.1:9190").
	Listen string
	// DataDir holds tracker.db and the artifacts; required.
	DataDir string
	// Artifacts is where the artifacts' bytes are kept: a directory
	// (default DataDir/artifacts), or an S3-compatible bucket as
	// s3://BUCKET[/PREFIX]?endpoint=URL[&region=R] (see openS3Store).
	Artifacts string
	// TVMListen, when set, is the address of the Apache TVM tracker-protocol listener.
	TVMListen string
	// TVMStopKey, when set, lets a TVM STOP message carrying it stop the tracker.
	TVMStopKey string
	// TVMIdleTimeout closes a TVM-protocol connection that sends nothing
	// for this long while it has no request waiting for a server
	// (DefaultTVMIdleTimeout when 0). TVM's rpc servers ask for their
	// pending match keys every few seconds, so they are never idle that
	// long.
	TVMIdleTimeout time.Duration
	// TVMMaxConnsPerPeer bounds the TVM-protocol connections of one peer
	// (an IP address) at once (DefaultTVMMaxConnsPerPeer when 0).
	TVMMaxConnsPerPeer int
	// Token, when set, is required in every kiln hello.
	Token string
	// TLS, when set, wraps the kiln listener (see proto.TLSConfig.Server).
	TLS *tls.Config
	// MetricsListen, when set, serves Prometheus text on /metrics there.
	MetricsListen string

	// HeartbeatInterval is what nodes are told to keep (default 2s).
	HeartbeatInterval time.Duration
	// LostAfter marks a silent node lost (default 3×HeartbeatInterval).
	LostAfter time.Duration
	// ForgetAfter removes a node lost for that long from the registry (default 1h).
	ForgetAfter time.Duration
	// LeaseTTL is a lease's life without renewal (default 60s); MaxLeaseTTL
	// bounds what a request may ask for (default 1h).
	LeaseTTL, MaxLeaseTTL time.Duration
	// LeaseWait bounds one lease.request or lease.wait call (default 1s).
	LeaseWait time.Duration
	// QuarantineAfter failures within FailureWindow quarantine a device
	// (defaults 3 and 10m).
	QuarantineAfter int
	FailureWindow   time.Duration
	// JobQueueTimeout and JobRunTimeout are the default limits on a build
	// job's time in the queue and running (defaults 1h and 10m).
	JobQueueTimeout, JobRunTimeout time.Duration
	// JobMaxAttempts bounds how often a job is requeued after its compiler
	// node was lost (default 3).
	JobMaxAttempts int
	// MaxModuleSize bounds a submitted module's text (default 32 MiB). A
	// module over proto.MaxInlineModule is streamed into the module store,
	// so the limit costs disk, not memory.
	MaxModuleSize int
	// MaxQueuedJobs and MaxQueuedBytes bound the build jobs waiting in
	// the queue and the bytes of their modules (defaults 256 and 512 MiB):
	// queued modules are held in memory.
	MaxQueuedJobs int
	// MaxQueuedJobsPerUser bounds the queued jobs of one named user (see
	// UsersFile; default 64).
	MaxQueuedJobsPerUser int
	MaxQueuedBytes       int64
	// MaxQueuedBytesPerUser bounds the module bytes of one named user's
	// queued jobs (default a quarter of MaxQueuedBytes), so that one user
	// cannot take the whole queue.
	MaxQueuedBytesPerUser int64
	// MaxResultsPerUser bounds the results store per owner: recording
	// past it evicts the owner's oldest (default 10000).
	MaxResultsPerUser int
	// MaxJobQueueTimeout and MaxJobRunTimeout are the longest queue and
	// run limits a job may ask for (defaults 24h and 1h).
	MaxJobQueueTimeout, MaxJobRunTimeout time.Duration
	// Insecure lets the tracker listen beyond loopback with neither a
	// token nor mutual TLS (New refuses that otherwise); it then warns.
	Insecure bool
	// JobOrphanGrace is how long a queued job submitted with
	// CancelOnDisconnect outlives the connection it belongs to before it
	// is cancelled, unless a connection waits for it again (default 30s).
	JobOrphanGrace time.Duration
	// JobRetention is how long a finished build job (succeeded, failed or
	// cancelled) is kept, in memory and in tracker.db, before it is
	// forgotten (default 168h). Its artifact is not removed with it.
	JobRetention time.Duration
	// UsersFile, when set, names the file of named user tokens (see
	// CreateUserToken): each admits its user in its one role, beside Token
	// (which admits any role). It is read again when it changes.
	UsersFile string
	// CredentialTTL is how long a node credential admits its node after
	// its last use (a hello or a heartbeat renews it); one unused for that
	// long is refused, and the node must join again (default 720h).
	CredentialTTL time.Duration
	// MaxArtifactBytes bounds the artifact store (default 10 GiB): an
	// upload over it is refused, and storing one evicts the least recently
	// used (stored or downloaded) others until the store fits.
	MaxArtifactBytes int64
	// MaxArtifactBytesPerUser is one owner's share of the artifact store
	// (default a quarter of MaxArtifactBytes): an owner's artifacts past
	// it evict their own least recently used, and a full store evicts
	// only from owners over an equal share of it, never from one within
	// it. Uploads in flight count against both from their first byte.
	MaxArtifactBytesPerUser int64
	// RecentJobs is how many jobs a query lists by default (20).
	RecentJobs int
	// Tick is how often expiries are checked (default HeartbeatInterval/4,
	// within [10ms, 1s]).
	Tick time.Duration
	// Store, when set to etcd://HOST:PORT[,HOST:PORT...], keeps the
	// tracker's state in that etcd cluster instead of DataDir/tracker.db,
	// and makes this tracker one replica of several (see the package
	// doc). EtcdTLS, when set, secures the connections to etcd.
	Store   string
	EtcdTLS *tls.Config
	// StoreInsecure lets Store be reached without EtcdTLS, over plain
	// http (New refuses that otherwise); the tracker then warns.
	StoreInsecure bool
	// Cluster, when set, runs an embedded etcd member in this process;
	// without Store the tracker uses it as its store.
	Cluster *ClusterConfig
	// Advertise is the kiln protocol address the other replicas forward
	// connections to while this one leads (default: Listen, with the
	// machine's host name when Listen binds every address). The TVM
	// listener is advertised on the same host, at its own port.
	Advertise string
	// ElectionTTL is how long a leader that stopped answering etcd keeps
	// its leadership: the time a failover takes (default 2s, whole
	// seconds).
	ElectionTTL time.Duration
	// Logger receives the tracker's logs (slog.Default() when nil).
	Logger *slog.Logger

	// etcdPrefix is where a replica's keys live in etcd (default
	// etcdKeyPrefix; tests sharing one etcd give each its own).
	etcdPrefix string
}

func (c *Config) setDefaults() error {
	if c.DataDir == "" {
		return errors.New("tracker config: DataDir is required")
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:9190"
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.HeartbeatInterval, 2*time.Second)
	def(&c.LostAfter, 3*c.HeartbeatInterval)
	def(&c.ForgetAfter, time.Hour)
	def(&c.LeaseTTL, time.Minute)
	def(&c.MaxLeaseTTL, time.Hour)
	def(&c.LeaseWait, time.Second)
	def(&c.TVMIdleTimeout, DefaultTVMIdleTimeout)
	if c.TVMMaxConnsPerPeer <= 0 {
		c.TVMMaxConnsPerPeer = DefaultTVMMaxConnsPerPeer
	}
	def(&c.FailureWindow, 10*time.Minute)
	def(&c.JobQueueTimeout, time.Hour)
	def(&c.JobRunTimeout, 10*time.Minute)
	def(&c.MaxJobQueueTimeout, 24*time.Hour)
	def(&c.MaxJobRunTimeout, time.Hour)
	def(&c.JobRetention, 7*24*time.Hour)
	def(&c.JobOrphanGrace, 30*time.Second)
	def(&c.CredentialTTL, 30*24*time.Hour)
	if c.MaxQueuedJobsPerUser <= 0 {
		c.MaxQueuedJobsPerUser = 64
	}
	if c.MaxResultsPerUser <= 0 {
		c.MaxResultsPerUser = 10000
	}
	if c.MaxQueuedJobs <= 0 {
		c.MaxQueuedJobs = 256
	}
	if c.MaxQueuedBytes <= 0 {
		c.MaxQueuedBytes = 512 << 20
	}
	if c.MaxQueuedBytesPerUser <= 0 {
		c.MaxQueuedBytesPerUser = max(c.MaxQueuedBytes/4, 1)
	}
	if c.Tick <= 0 {
		c.Tick = min(max(c.HeartbeatInterval/4, 10*time.Millisecond), time.Second)
	}
	if c.QuarantineAfter <= 0 {
		c.QuarantineAfter = 3
	}
	if c.JobMaxAttempts <= 0 {
		c.JobMaxAttempts = 3
	}
	if c.MaxModuleSize <= 0 {
		c.MaxModuleSize = 32 << 20
	}
	if c.MaxArtifactBytes <= 0 {
		c.MaxArtifactBytes = 10 << 30
	}
	if c.MaxArtifactBytesPerUser <= 0 {
		c.MaxArtifactBytesPerUser = max(c.MaxArtifactBytes/4, 1)
	}
	c.MaxArtifactBytesPerUser = min(c.MaxArtifactBytesPerUser, c.MaxArtifactBytes)
	if c.RecentJobs <= 0 {
		c.RecentJobs = 20
	}
	def(&c.ElectionTTL, 2*time.Second)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// replicated reports whether the tracker runs as one replica of several,
// over etcd.
func (c *Config) replicated() bool { return c.Store != "" || c.Cluster != nil }
