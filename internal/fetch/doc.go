// Package fetch is the download engine behind the plan's download resource: it brings a set
// of files (52 GB model checkpoints) into a destination directory whole and verified, and
// survives a killed agent or a dropped connection without starting over.
//
// # Layout in Dest
//
// A file NAME streams into .NAME.partial beside its final place, with a small sidecar
// .NAME.partial.json that records the URL, the ETag, the expected size and sha256, and a
// checkpoint: an offset together with the sha256 state (crypto/sha256's internal state is an
// encoding.BinaryMarshaler) after exactly that many bytes. The data is fsynced before the
// sidecar is replaced, so a sidecar never claims bytes the disk does not hold. Only when the
// size and the sha256 match is the partial file fsynced, renamed into place and the directory
// fsynced. Dest/.agent-manifest.json (0600, written atomically) records, per file, the size,
// mtime, sha256, source and when it was verified, so Check can confirm a converged download
// with os.Stat alone; Dest/.agent-fetch.lock keeps two agents out of the same directory.
//
// # Parallel ranges
//
// A file larger than one piece is fetched by range workers on net/http (a size the caller
// does not give is learned first: HEAD, else the Content-Range of a first ranged GET), up to
// Options.Connections per file within Options.MaxConnections for the Fetch, writing at
// offsets, with one hasher per file following the contiguous prefix through the page cache,
// a version-2 sidecar of durable bytes per piece, and a live record (.NAME.partial.live)
// that counts every written byte within one boot: see ranged.go and live.go. Retries
// (retry.go) reset their budget whenever bytes arrive, honour Retry-After and jitter their
// backoff; every path shares them.
//
// # Why grab, and how it is bent (the single stream)
//
// The transfer runs on github.com/cavaliergopher/grab/v3: its request state machine (HEAD probe
// for Accept-Ranges, Range request, opening the partial file for append, the copy loop with
// cancellation). grab alone would append a 200 whole body to a partial file, never compares
// ETags between attempts, and hashes the file in a second full read after writing it. Those
// gaps are closed without forking grab:
//
//   - The http.Client handed to grab wraps the transport. For a 200/206 GET it wraps the body
//     in a reader that feeds sha256 as bytes stream in, counts them for progress and stall
//     detection, and writes checkpoints. grab's copy loop writes each read before the next
//     read, so at the start of a read the hash covers exactly the partial file; a checkpoint is
//     only taken when fstat agrees, so it never depends on that detail silently.
//   - grab's BeforeCopy hook sees the response before a byte is copied. A resumed request must
//     be 206 with a Content-Range that starts at the local partial size, the same total and the
//     same ETag (If-Range is sent too); anything else (a 200 whole body, a changed ETag or size)
//     is refused and the file restarts from zero. Content-Encoding other than identity is
//     refused (Accept-Encoding: identity is always sent).
//   - Before each attempt the partial file is truncated to the sidecar's checkpoint and the
//     hash state restored, so a resume after a crash hashes at most the bytes written since
//     the last checkpoint and never trusts bytes it did not hash.
//
// Headers given for a file (Authorization) are added by that transport only to requests for
// the file URL's scheme and host:port, so a redirect to a CDN never carries them. Only https
// URLs are fetched, except loopback hosts or with Options.Insecure, redirects included.
//
// A server without ETags is resumed on its size alone; the sha256 at the end still catches a
// file that changed underneath. Check's contract is stat-only: a file rewritten with the same
// size and mtime is not noticed until its mtime changes.
//
// grab learns whether it may resume from a HEAD request. A server that refuses HEAD (403,
// 405, 501) or answers it without Accept-Ranges is probed by the transport with a one-byte
// range GET; a 206 is handed to grab as the HEAD answer (Accept-Ranges, total size, ETag), so
// the resume still happens and its response is still checked in full. A server without range
// support gets a plain GET and the file restarts from zero: correct, only the resume is lost.
package fetch
