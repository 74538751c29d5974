# model.sh, sourced by run.sh and the bench scripts that apply the quickstart plan (from
# the repository root): quickstart_model DIR [RATE] makes the quickstart's model directory
# under DIR (examples/quickstart/model plus 16 MiB of placeholder weights, zeros, pinned
# by sha256 in quickstart.hcl), serves it on a loopback port with bench/downloadserve
# (each response paced at RATE bytes/s when given, so that a download has time to show
# its progress bar; each response logged to DIR/origin.log), and sets model_url (the
# plan's var.model_url) and model_pid.
# internal/testbin's QuickstartModel is the same for Go tests.
quickstart_model() {
	origin="$1/origin"
	mkdir -p "$origin" bin
	cp examples/quickstart/model/config.json examples/quickstart/model/tokenizer.json "$origin/"
	head -c 16777216 /dev/zero >"$origin/model.safetensors"
	go build -o bin/downloadserve ./bench/downloadserve
	rm -f "$1/origin.port"
	bin/downloadserve -dir "$origin" -port-file "$1/origin.port" -rate "${2:-0}" -log 2>>"$1/origin.log" &
	model_pid=$!
	i=0
	while [ ! -s "$1/origin.port" ]; do
		i=$((i + 1))
		if [ "$i" -gt 200 ]; then
			echo "model.sh: the model server did not start (see $1/origin.log)" >&2
			return 1
		fi
		sleep 0.05
	done
	model_url="http://127.0.0.1:$(cat "$1/origin.port")"
}
