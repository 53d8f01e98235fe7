# planbot's own Proxmox findings (data.planbot.findings) as policy results: a download without
# a checksum (PVE006, a warning in planbot) becomes a blocker, and a VM replaced or destroyed
# (PVE008) a warning repeated in the policy results.
package main

import rego.v1

blocking_rules := {"PVE006"}

deny contains msg if {
	some f in data.planbot.findings
	f.rule in blocking_rules
	msg := sprintf("%s %s: %s (a blocker in this repository)", [f.rule, f.address, f.message])
}

warn contains msg if {
	some f in data.planbot.findings
	f.rule == "PVE008"
	msg := sprintf("%s %s: %s", [f.rule, f.address, f.title])
}
