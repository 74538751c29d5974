package view

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/agent-dev/agent/agent"
)

// Redactor replaces secret values in text that reaches people or machines. Per-attribute
// Sensitive flags keep known secrets out of diffs; the redactor is the backstop for
// error messages and anything else that might quote a secret.
type Redactor struct{ secrets []string }

// NewRedactor redacts the given values (a plan's Secrets).
func NewRedactor(secrets []string) *Redactor { return &Redactor{secrets: secrets} }

// String returns s with every secret replaced by "(sensitive)".
func (r *Redactor) String(s string) string {
	if r == nil {
		return s
	}
	for _, sec := range r.secrets {
		if sec != "" {
			s = strings.ReplaceAll(s, sec, "(sensitive)")
		}
	}
	return s
}

// RedactingHandler is a slog.Handler that runs the message and every attribute of a
// record through a Redactor before the next handler sees it: resources and the daemon
// log errors, and an error may quote a secret (a URL with a token in it, a flag value).
// The redactor can be swapped (a reloaded plan has other secrets); loggers derived with
// With share it. It is also the log's view of the engine's data: an attribute holding a
// diff's changes ([]agent.Change, the engine's "applying" line) is written as
// LogChanges: each change its own structured attribute, in text and JSON logs alike.
type RedactingHandler struct {
	next slog.Handler
	r    *atomic.Pointer[Redactor]
}

// NewRedactingHandler wraps next; r may be nil until a plan is loaded.
func NewRedactingHandler(next slog.Handler, r *Redactor) *RedactingHandler {
	h := &RedactingHandler{next: next, r: new(atomic.Pointer[Redactor])}
	h.r.Store(r)
	return h
}

// SetRedactor makes r the redactor of this handler and of every one derived from it.
func (h *RedactingHandler) SetRedactor(r *Redactor) { h.r.Store(r) }

// Enabled implements slog.Handler.
func (h *RedactingHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

// Handle implements slog.Handler.
func (h *RedactingHandler) Handle(ctx context.Context, rec slog.Record) error {
	r := h.r.Load()
	if (r == nil || len(r.secrets) == 0) && !hasChanges(rec) {
		return h.next.Handle(ctx, rec)
	}
	out := slog.NewRecord(rec.Time, rec.Level, r.String(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(redactAttr(r, a))
		return true
	})
	return h.next.Handle(ctx, out)
}

// WithAttrs implements slog.Handler. The attributes are redacted with the redactor of
// the moment, as they are fixed from then on.
func (h *RedactingHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	r := h.r.Load()
	red := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		red[i] = redactAttr(r, a)
	}
	return &RedactingHandler{next: h.next.WithAttrs(red), r: h.r}
}

// WithGroup implements slog.Handler.
func (h *RedactingHandler) WithGroup(name string) slog.Handler {
	return &RedactingHandler{next: h.next.WithGroup(name), r: h.r}
}

// hasChanges reports whether rec has an attribute that is a diff's changes.
func hasChanges(rec slog.Record) bool {
	found := false
	rec.Attrs(func(a slog.Attr) bool {
		_, found = a.Value.Any().([]agent.Change)
		return !found
	})
	return found
}

func redactAttr(r *Redactor, a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	if c, ok := v.Any().([]agent.Change); ok {
		v = slog.AnyValue(LogChanges(c)).Resolve() // a group, redacted below
	}
	if r == nil {
		return slog.Attr{Key: a.Key, Value: v}
	}
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, r.String(v.String()))
	case slog.KindGroup:
		group := v.Group()
		red := make([]any, len(group))
		for i, g := range group {
			red[i] = redactAttr(r, g)
		}
		return slog.Group(a.Key, red...)
	case slog.KindAny:
		// Errors and anything else that prints: compare the printed form.
		s := fmt.Sprint(v.Any())
		if red := r.String(s); red != s {
			return slog.String(a.Key, red)
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}
