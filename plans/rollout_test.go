package plans

import (
	"strings"
	"testing"
)

func TestRolloutBlock(t *testing.T) {
	t.Parallel()
	const servers = `
variable "group" {
  default = "qwen"
}
server "a" {
  command = ["a"]
  rollout {
    group           = var.group
    max_unavailable = 2
  }
}
server "b" {
  command = ["b"]
  rollout {
    group           = "qwen"
    max_unavailable = 2
  }
}
container "c" {
  image = "debian"
  rollout { group = "boxes" }
}
server "d" {
  command = ["d"]
}
`
	p, diags := load(t, servers, Options{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	got := p.RolloutGroups()
	if len(got) != 2 || got[0].Name != "boxes" || got[0].MaxUnavailable != 1 || strings.Join(got[0].Members, ",") != "container.c" ||
		got[1].Name != "qwen" || got[1].MaxUnavailable != 2 || strings.Join(got[1].Members, ",") != "server.a,server.b" {
		t.Fatalf("groups = %+v", got)
	}
	if p.Resource("server.d").Rollout != nil {
		t.Error("server.d has no rollout block but got one")
	}
	if v := p.Resource("server.a").Value; v.Type().HasAttribute("rollout") {
		t.Error("the rollout block leaks into the resource's value")
	}

	for _, tc := range []struct {
		name, src, want string
	}{
		{"bad group", `server "a" {
  command = ["a"]
  rollout { group = "no spaces" }
}`, "Invalid rollout group"},
		{"zero max", `server "a" {
  command = ["a"]
  rollout {
    group           = "g"
    max_unavailable = 0
  }
}`, "Invalid max_unavailable"},
		{"missing group", `server "a" {
  command = ["a"]
  rollout { max_unavailable = 1 }
}`, "Missing required argument"},
		{"two blocks", `server "a" {
  command = ["a"]
  rollout { group = "g" }
  rollout { group = "h" }
}`, "Duplicate rollout block"},
		{"conflicting max", `server "a" {
  command = ["a"]
  rollout { group = "g" }
}
server "b" {
  command = ["b"]
  rollout {
    group           = "g"
    max_unavailable = 3
  }
}`, "Conflicting max_unavailable"},
		{"unknown attribute", `server "a" {
  command = ["a"]
  rollout {
    group = "g"
    surge = 1
  }
}`, "Unsupported argument"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, diags := load(t, tc.src, Options{})
			if !diags.HasErrors() || !strings.Contains(diags.Error(), tc.want) {
				t.Fatalf("diagnostics %v, want %q", diags, tc.want)
			}
		})
	}
}
