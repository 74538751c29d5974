package plans

import (
	"bytes"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// chunkBytes is the size a plan file is cut into for parsing: large enough that a chunk
// holds many blocks, small enough that its tokens stay in memory already mapped.
const chunkBytes = 16 << 10

// parseFile parses one plan file. HCL's lexer keeps every token of a file in one slice
// (about 100 bytes a token, grown by copying), so a plan of thousands of resources made
// a short-lived process fault in tens of megabytes of fresh memory: on a virtual machine
// that cost more than the parse itself. A large file is therefore parsed in chunks cut
// at lines that start a top-level block, each with its true start position, and the
// chunks' bodies merged. A cut that falls inside a block, a heredoc or a comment leaves
// an unterminated chunk, so any error, or an attribute defined in two chunks, parses the
// whole file again: the diagnostics are always the whole-file parse's own.
func parseFile(data []byte, name string) (*hcl.File, hcl.Diagnostics) {
	if len(data) <= 2*chunkBytes {
		return hclsyntax.ParseConfig(data, name, hcl.InitialPos)
	}
	if f := parseChunks(data, name, chunkBytes); f != nil {
		return f, nil
	}
	return hclsyntax.ParseConfig(data, name, hcl.InitialPos)
}

// parseChunks returns nil when any chunk does not parse cleanly. The chunks are
// independent, so they are parsed at once, one goroutine per processor.
func parseChunks(data []byte, name string, size int) *hcl.File {
	if len(data) == 0 {
		return nil
	}
	// The file's own *hcl.File (with its navigation, which diagnostics use to name the
	// enclosing block) gets the merged body.
	f, diags := hclsyntax.ParseConfig(nil, name, hcl.InitialPos)
	if diags.HasErrors() {
		return nil
	}
	type chunk struct {
		text []byte
		pos  hcl.Pos
		body *hclsyntax.Body
	}
	var chunks []*chunk
	pos := hcl.InitialPos
	for start := 0; start < len(data); {
		end := cutAfter(data, start+size)
		chunks = append(chunks, &chunk{text: data[start:end], pos: pos})
		pos = advance(pos, data[start:end])
		start = end
	}
	next := make(chan *chunk)
	var failed atomic.Bool
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(chunks)) {
		wg.Go(func() {
			for c := range next {
				cf, diags := hclsyntax.ParseConfig(c.text, name, c.pos)
				if diags.HasErrors() {
					failed.Store(true)
					continue
				}
				c.body = cf.Body.(*hclsyntax.Body)
			}
		})
	}
	for _, c := range chunks {
		next <- c
	}
	close(next)
	wg.Wait()
	if failed.Load() {
		return nil
	}
	root := f.Body.(*hclsyntax.Body)
	for _, c := range chunks {
		for k, a := range c.body.Attributes {
			if _, dup := root.Attributes[k]; dup {
				return nil
			}
			root.Attributes[k] = a
		}
		root.Blocks = append(root.Blocks, c.body.Blocks...)
	}
	// As the whole file's: from its first token (comments are not tokens; a chunk of
	// comments alone ends where the next chunk's first token starts) to its end.
	last := chunks[len(chunks)-1].body
	root.SrcRange = hcl.RangeBetween(chunks[0].body.SrcRange, last.SrcRange)
	root.EndRange = last.EndRange
	f.Bytes = data
	return f
}

// cutAfter is the offset of the first line at or after off that starts with a letter
// (a top-level block or attribute begins there when the text before it is complete), or
// len(data).
func cutAfter(data []byte, off int) int {
	for off < len(data) {
		i := bytes.IndexByte(data[off:], '\n')
		if i < 0 {
			return len(data)
		}
		off += i + 1
		if off < len(data) {
			if c := data[off]; c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' {
				return off
			}
		}
	}
	return len(data)
}

// advance is the position after text that starts at pos (columns counted in bytes, as
// the cut is at a line start and only the file's last line may end without a newline).
func advance(pos hcl.Pos, text []byte) hcl.Pos {
	pos.Byte += len(text)
	last := bytes.LastIndexByte(text, '\n')
	if last < 0 {
		pos.Column += len(text)
		return pos
	}
	pos.Line += bytes.Count(text, []byte{'\n'})
	pos.Column = len(text) - last
	return pos
}
