package agent

import "sync"

// Memory is what the kinds remember between steps while one agent runs, and never on
// disk: the judgements their watches keep (a server's liveness) and what was already
// said (a rejected change the loop holds, a cluster member reported down), so that the
// loop says each once. Whoever runs the loop owns it: the daemon keeps one across the
// engines of its plan reloads (Options.Memory), and an engine given none makes its own.
// Every step gets it as Env.Memory, so two engines share none of it unless given the
// same Memory. Keys are the kind's own ("server liveness …"); a nil Memory remembers
// nothing.
type Memory struct{ m sync.Map }

// NewMemory is an empty Memory.
func NewMemory() *Memory { return new(Memory) }

// Load is what key holds, and whether it holds anything.
func (m *Memory) Load(key string) (any, bool) {
	if m == nil {
		return nil, false
	}
	return m.m.Load(key)
}

// Store makes key hold v.
func (m *Memory) Store(key string, v any) {
	if m != nil {
		m.m.Store(key, v)
	}
}

// LoadOrStore is what key holds (loaded: true), or v, which key then holds.
func (m *Memory) LoadOrStore(key string, v any) (actual any, loaded bool) {
	if m == nil {
		return v, false
	}
	return m.m.LoadOrStore(key, v)
}

// Range calls f for each key and what it holds, until f returns false (sync.Map's Range:
// no consistent snapshot). `agent run` exports the values that are Prometheus collectors.
func (m *Memory) Range(f func(key string, v any) bool) {
	if m != nil {
		m.m.Range(func(k, v any) bool { return f(k.(string), v) })
	}
}

// Recall is what key holds in m as a T; false when it holds nothing or something else.
// A kind's observation reads a judgement its watch keeps through it.
func Recall[T any](m *Memory, key string) (T, bool) {
	x, _ := m.Load(key)
	t, ok := x.(T)
	return t, ok
}

// Delete forgets key.
func (m *Memory) Delete(key string) {
	if m != nil {
		m.m.Delete(key)
	}
}
