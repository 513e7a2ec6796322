package fleet

import (
	"context"
	"os"
	"sync"
	"time"

	"github.com/pleg-bridge/pleg-bridge/harness/proc"
)

// sampleEvery is how often the monitor reads the processes' memory and
// CPU and asks each bridge process for its pending events. A drain is
// timed to this resolution.
const sampleEvery = 250 * time.Millisecond

// Usage is a process's memory and CPU over the run, every incarnation of
// it together.
type Usage struct {
	Name    string
	PeakRSS int64         // the highest VmHWM of any incarnation
	CPU     time.Duration // the incarnations' CPU time, as last sampled
	LastRSS int64         // VmRSS at the last sample
	Nodes   int           // for a bridge process, how many nodes it runs
	Disk    int64         // for a server, its store's bytes at the end

	pid     int           // the incarnation last sampled
	pidCPU  time.Duration // its CPU time at that sample
	doneCPU time.Duration // the CPU time of the incarnations before it
}

// add takes a sample of incarnation pid.
func (u *Usage) add(pid int, s proc.Sample) {
	if pid != u.pid {
		u.doneCPU += u.pidCPU
		u.pid, u.pidCPU = pid, 0
	}
	u.pidCPU = s.CPU
	u.CPU = u.doneCPU + u.pidCPU
	u.PeakRSS = max(u.PeakRSS, s.PeakRSS)
	u.LastRSS = s.RSS
}

// sample is what the monitor saw at one moment.
type sample struct {
	at        time.Time
	serverRSS []int64 // per server, 0 while it is down
	// serverCPU is the servers' CPU time so far, summed over the servers
	// and their incarnations (as Usage.CPU counts it).
	serverCPU  time.Duration
	pending    []int // per node; -1 where its process did not answer
	total      int   // the pending events of the nodes that answered
	unanswered int   // nodes whose process did not answer
}

// monitor samples the servers' and bridge processes' usage and the
// bridges' pending events every sampleEvery, keeps the samples for the
// report, and notices a child that exited on its own. Run owns its
// goroutine; the other methods are safe for concurrent use with it.
type monitor struct {
	servers []*proc.Process
	bridges []*bridgeGroup
	nodes   int

	mu      sync.Mutex
	usage   map[*proc.Process]*Usage // guarded by mu
	self    Usage                    // the harness: runtimes, churn; guarded by mu
	samples []sample                 // guarded by mu
	tick    chan struct{}            // closed and replaced at each sample; guarded by mu
	failed  chan struct{}            // closed when a child crashed
	failure error                    // set before failed is closed
	once    sync.Once
}

func newMonitor(srv *servers, bridges []*bridgeGroup, nodes int) *monitor {
	m := &monitor{servers: srv.procs, bridges: bridges, nodes: nodes, usage: map[*proc.Process]*Usage{},
		tick: make(chan struct{}), failed: make(chan struct{})}
	m.self.Name = "harness"
	for _, p := range srv.procs {
		m.usage[p] = &Usage{Name: p.Name()}
	}
	for _, g := range bridges {
		m.usage[g.proc] = &Usage{Name: g.proc.Name(), Nodes: len(g.nodes)}
	}
	return m
}

// Run samples until ctx is done, then returns nil.
func (m *monitor) Run(ctx context.Context) error {
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	for {
		m.sampleOnce(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (m *monitor) sampleOnce(ctx context.Context) {
	s := sample{at: time.Now(), serverRSS: make([]int64, len(m.servers)), pending: make([]int, m.nodes)}
	read := func(p *proc.Process) (proc.Sample, int, bool) {
		ps, pid, err := p.Usage()
		return ps, pid, err == nil
	}
	m.mu.Lock()
	for i, p := range m.servers {
		if ps, pid, ok := read(p); ok {
			m.usage[p].add(pid, ps)
			s.serverRSS[i] = ps.RSS
		}
		s.serverCPU += m.usage[p].CPU
	}
	for _, g := range m.bridges {
		if ps, pid, ok := read(g.proc); ok {
			m.usage[g.proc].add(pid, ps)
		}
	}
	if ps, err := proc.ReadUsage(os.Getpid()); err == nil {
		m.self.add(os.Getpid(), ps)
	}
	m.mu.Unlock()

	// The bridges answer outside the lock: a slow process delays the
	// sample, not the readers of the last one.
	var wg sync.WaitGroup
	for _, g := range m.bridges {
		wg.Go(func() {
			var st childStats
			err := g.proc.Request(ctx, "pending", &st)
			for j, node := range g.nodes {
				v := -1
				if err == nil && j < len(st.Pending) {
					v = st.Pending[j]
				}
				s.pending[node] = v
			}
		})
	}
	wg.Wait()
	for _, v := range s.pending {
		if v < 0 {
			s.unanswered++
		} else {
			s.total += v
		}
	}
	for _, p := range append(append([]*proc.Process(nil), m.servers...), m.bridgeProcs()...) {
		select {
		case <-p.Crashed():
			m.once.Do(func() {
				m.failure = p.ExitError()
				close(m.failed)
			})
		default:
		}
	}
	m.mu.Lock()
	m.samples = append(m.samples, s)
	close(m.tick)
	m.tick = make(chan struct{})
	m.mu.Unlock()
}

func (m *monitor) bridgeProcs() []*proc.Process {
	var ps []*proc.Process
	for _, g := range m.bridges {
		ps = append(ps, g.proc)
	}
	return ps
}

// next returns a channel closed at the next sample.
func (m *monitor) next() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.tick
}

// last returns the last sample, the zero sample before the first.
func (m *monitor) last() sample {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.samples) == 0 {
		return sample{}
	}
	return m.samples[len(m.samples)-1]
}

// between returns the samples taken in [from, to).
func (m *monitor) between(from, to time.Time) []sample {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []sample
	for _, s := range m.samples {
		if !s.at.Before(from) && s.at.Before(to) {
			out = append(out, s)
		}
	}
	return out
}

// usages returns the servers', the bridge processes' and the harness's
// usage so far.
func (m *monitor) usages() (servers, bridges []Usage, self Usage) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.servers {
		servers = append(servers, *m.usage[p])
	}
	for _, g := range m.bridges {
		bridges = append(bridges, *m.usage[g.proc])
	}
	return servers, bridges, m.self
}

// waitDrained waits until every node has been seen with nothing pending
// in a sample taken after since, and returns how long after since the last
// of them was; it gives up after timeout, returning the time waited and
// false. It returns early if ctx ends or a child crashed.
func (m *monitor) waitDrained(ctx context.Context, since time.Time, timeout time.Duration) (time.Duration, bool, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	drained := make([]bool, m.nodes)
	left := m.nodes
	for {
		tick := m.next()
		s := m.last()
		if s.at.After(since) {
			for i, v := range s.pending {
				if v == 0 && !drained[i] {
					drained[i] = true
					left--
				}
			}
			if left == 0 {
				return s.at.Sub(since), true, nil
			}
		}
		select {
		case <-ctx.Done():
			return 0, false, ctx.Err()
		case <-m.failed:
			return 0, false, m.failure
		case <-deadline.C:
			return time.Since(since), false, nil
		case <-tick:
		}
	}
}
