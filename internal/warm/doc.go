// Package warm reads a model's weight files into the page cache ahead of the engine that
// will read them: before a planned stop, while the old generation still serves, and at a
// cold start beside the engine's own load.
//
// Only the pages not already resident are read (mincore over an mmap of each file: a
// warm restart reads nothing), by a few parallel readers in 16 MiB sequential blocks at
// the idle I/O priority class (ioprio_set), so the serving generation is not slowed.
// A warm-up runs only when what it would read fits: at most 90 % of MemAvailable
// (/proc/meminfo, under the host root) less a margin; otherwise it is skipped and says
// why. It is bounded by its context, and it never touches the mapped memory (a file
// truncated under it cannot fault the agent).
//
// The rule for which files a server reads is WeightFiles; vLLM's prefetch
// (vllm-project/vllm#36012, _prefetch_all_checkpoints) and pegainfer#950 (when a
// prefetch hurts: a checkpoint larger than memory, a warm cache) are the models.
package warm
