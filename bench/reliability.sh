#!/usr/bin/env bash
# bench/reliability.sh: the figures of issue 9, one line per guarantee (docs/reliability.md
# records them; docs/security.md says what each test proves).
#   kills survived          test/chaos: SIGKILLs of `agent apply` at random points, then
#                           converged, nothing unverified in place, no partial lost, one
#                           server, one log generation per launch, state whole, lock free
#   fuzz executions         go test -fuzz on each parser for FUZZTIME, without a failure
#   hostile inputs refused  the hostile-input tests' cases that passed, of all of them
#   secrets leaked          planted secrets found in output, logs, state, /metrics, /status
# Usage: bench/reliability.sh   (env: CHAOS_KILLS=50 CHAOS_REVERT_KILLS=8 CHAOS_REVERT_HOLD=1m
#                                CHAOS_SEED=… FUZZTIME=10s)
# Needs Go; no GPU, no network. Exits 1 when a guarantee does not hold.
set -uo pipefail
cd "$(dirname "$0")/.."
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
kills=${CHAOS_KILLS:-50}
fuzztime=${FUZZTIME:-10s}
log=$(mktemp /tmp/agent-reliability.XXXXXX)
trap 'rm -f "$log"' EXIT
status=0

# Crash anywhere.
t0=$(date +%s)
if CHAOS_KILLS=$kills go test ./test/chaos -run '^TestChaos$' -count=1 -v -timeout 30m >"$log" 2>&1; then
	line=$(grep -o 'CHAOS kills=.*' "$log" | tail -n1)
	survived=$(sed -n 's/.*kills=\([0-9]*\).*/\1/p' <<<"$line")
	seed=$(sed -n 's/.*seed=\([0-9-]*\).*/\1/p' <<<"$line")
	resumes=$(sed -n 's/.*resumes=\([0-9]*\).*/\1/p' <<<"$line")
	launches=$(sed -n 's/.*launches=\([0-9]*\).*/\1/p' <<<"$line")
	printf 'kills survived:          %s of %s (seed %s; %s launches, %s downloads resumed from a checkpoint; %ss)\n' \
		"$survived" "$kills" "$seed" "$launches" "$resumes" $(( $(date +%s) - t0 ))
else
	printf 'kills survived:          FAILED (%s)\n' "$(grep -m1 -o 'chaos seed .*' "$log" || tail -n3 "$log")"
	status=1
fi

# Crash anywhere, the container plan on a private incusd (skipped without incusd).
t0=$(date +%s)
if CHAOS_KILLS=$kills go test ./test/chaos -run '^TestChaosContainer$' -count=1 -v -timeout 30m >"$log" 2>&1; then
	line=$(grep -o 'CHAOS_CONTAINER kills=.*' "$log" | tail -n1)
	if [ -z "$line" ]; then
		printf 'container kills survived: skipped (%s)\n' "$(grep -m1 -o 'incustest: .*' "$log" || echo 'no incusd')"
	else
		printf 'container kills survived: %s of %s (seed %s; %s in creations, %s in updates, %s in restarts; %ss)\n' \
			"$(sed -n 's/.*kills=\([0-9]*\).*/\1/p' <<<"$line")" "$kills" "$(sed -n 's/.*seed=\([0-9-]*\).*/\1/p' <<<"$line")" \
			"$(sed -n 's/.*creates=\([0-9]*\).*/\1/p' <<<"$line")" "$(sed -n 's/.*updates=\([0-9]*\).*/\1/p' <<<"$line")" \
			"$(sed -n 's/.*restarts=\([0-9]*\).*/\1/p' <<<"$line")" $(( $(date +%s) - t0 ))
	fi
else
	printf 'container kills survived: FAILED (%s)\n' "$(grep -m1 -o 'chaos container seed .*' "$log" || tail -n3 "$log")"
	status=1
fi

# Crash anywhere in a revert (issue 25): SIGKILLs of `agent run` while a change fails and
# is rolled back, then a minute of the daemon holding the rejected change (the suite holds
# it 20 s).
t0=$(date +%s)
if CHAOS_REVERT_HOLD=${CHAOS_REVERT_HOLD:-1m} go test ./test/chaos -run '^TestChaosRevert$' -count=1 -v -timeout 30m >"$log" 2>&1; then
	line=$(grep -o 'CHAOS_REVERT kills=.*' "$log" | tail -n1)
	printf 'revert kills survived:   %s (seed %s; rejected change held %s, not launched again; %ss)\n' \
		"$(sed -n 's/.*kills=\([0-9]*\).*/\1/p' <<<"$line")" "$(sed -n 's/.*seed=\([0-9-]*\).*/\1/p' <<<"$line")" \
		"$(sed -n 's/.*hold=\([^ ]*\).*/\1/p' <<<"$line")" $(( $(date +%s) - t0 ))
else
	printf 'revert kills survived:   FAILED (%s)\n' "$(grep -m1 -o 'chaos revert seed .*' "$log" || tail -n3 "$log")"
	status=1
fi

# Fuzz executions without failure.
total=0
detail=()
for target in plans:FuzzLoad internal/engines:FuzzParseLine internal/proc:FuzzParseStat internal/incus:FuzzDecodeResponse resources:FuzzHubList; do
	pkg=${target%%:*} name=${target##*:}
	# A duration-limited run can end in a bare "context deadline exceeded" with no failing
	# input, a race in Go 1.26's fuzz coordinator (golang/go#75804), not a finding: it
	# counts as a run without failure. A real failure writes its input under testdata/fuzz.
	if go test "./$pkg" -run '^$' -fuzz "^$name\$" -fuzztime "$fuzztime" >"$log" 2>&1 ||
		{ grep -q '^    context deadline exceeded$' "$log" && ! grep -q 'Failing input written' "$log"; }; then
		n=$(grep -o 'execs: [0-9]*' "$log" | tail -n1 | grep -o '[0-9]*')
		total=$((total + ${n:-0}))
		detail+=("$name ${n:-0}")
	else
		detail+=("$name FAILED")
		status=1
	fi
done
printf 'fuzz executions:         %s without failure, %s per target (%s)\n' "$total" "$fuzztime" "$(IFS=,; echo "${detail[*]}" | sed 's/,/, /g')"

# Hostile inputs refused: every case of the hostile-input tests.
go test ./plans -run 'TestHostileSourcesAreBounded|TestStrictModes|FuzzLoad' -count=1 -v >"$log" 2>&1
go test ./resources -run 'TestHubHostileServerBoundedByDeadline|FuzzHubList|TestDownloadHubRefusesUnsafePaths' -count=1 -v >>"$log" 2>&1
go test ./internal/incus -run 'TestHostileDaemonBoundedByDeadline|FuzzDecodeResponse' -count=1 -v >>"$log" 2>&1
go test ./internal/fetch -run 'TestRefusesUnsafeNames|TestURLPolicy|TestFaults' -count=1 -v >>"$log" 2>&1
go test ./test/hostile -count=1 -v >>"$log" 2>&1
pass=$(grep -c -- '--- PASS: .*/' "$log")
fail=$(grep -c -- '--- FAIL' "$log")
skip=$(grep -c -- '--- SKIP' "$log")
printf 'hostile inputs refused:  %s of %s cases (%s skipped: not root)\n' "$pass" $((pass + $(grep -c -- '--- FAIL: .*/' "$log"))) "$skip"
[ "$fail" -eq 0 ] || status=1

# Secrets leaked.
go test ./test/secrets -count=1 -v >"$log" 2>&1
line=$(grep -o 'SECRETS places=.*' "$log" | tail -n1)
leaked=$(sed -n 's/.*leaked=\([0-9]*\).*/\1/p' <<<"$line")
places=$(sed -n 's/.*places=\([0-9]*\).*/\1/p' <<<"$line")
printf 'secrets leaked:          %s (searched %s places: output, --json, debug logs, errors, state, logs, /metrics, /status)\n' "${leaked:-?}" "${places:-?}"
if [ "${leaked:-1}" != 0 ]; then
	grep 'the planted secret' "$log" | sed 's/^ */    /'
	status=1
fi
exit $status
