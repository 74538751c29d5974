// Command weights writes, evicts and inspects a fake checkpoint for bench/relaunch.sh:
//
//	weights write DIR MIB SHARDS   a checkpoint of SHARDS safetensors files, MIB in all
//	                               (testbin.WriteWeights: what the fake's load mode reads)
//	weights evict DIR              drop its files from the page cache (posix_fadvise DONTNEED)
//	weights resident DIR           print "RESIDENT TOTAL" in bytes (mincore)
//	weights warm DIR               read what is not resident, as the agent's warm-up does
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"

	"github.com/agent-dev/agent/internal/testbin"
	"github.com/agent-dev/agent/internal/warm"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "weights:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 2 {
		return fmt.Errorf("usage: weights write DIR MIB SHARDS | evict DIR | resident DIR")
	}
	dir := args[1]
	switch args[0] {
	case "write":
		if len(args) != 4 {
			return fmt.Errorf("usage: weights write DIR MIB SHARDS")
		}
		mib, err1 := strconv.ParseInt(args[2], 10, 64)
		shards, err2 := strconv.Atoi(args[3])
		if err1 != nil || err2 != nil || mib <= 0 || shards <= 0 {
			return fmt.Errorf("MIB and SHARDS are positive numbers")
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		_, err := testbin.WriteWeights(dir, shards, (mib<<20)/int64(shards))
		return err
	case "warm":
		files, err := warm.WeightFiles(dir)
		if err != nil {
			return err
		}
		res, err := warm.Warm(context.Background(), files, warm.Options{})
		fmt.Printf("read %d of %d bytes (%d resident before) in %.2f s\n", res.Read, res.Bytes, res.ResidentBefore, res.Seconds)
		return err
	case "evict", "resident":
		files, err := warm.WeightFiles(dir)
		if err != nil {
			return err
		}
		var resident, total int64
		for _, f := range files {
			if args[0] == "evict" {
				if err := warm.Evict(f); err != nil {
					return err
				}
				continue
			}
			r, err := warm.Resident(f)
			if err != nil {
				return err
			}
			st, err := os.Stat(f)
			if err != nil {
				return err
			}
			resident, total = resident+r, total+st.Size()
		}
		if args[0] == "resident" {
			fmt.Println(resident, total)
		}
		return nil
	}
	return fmt.Errorf("unknown command %q", args[0])
}
