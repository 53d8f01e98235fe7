# Memory and core caps for every planned VM and container. Change the caps to yours.
package main

import rego.v1

max_memory_mib := 16384

max_cores := 8

deny contains msg if {
	some rc in planned
	memory := memory_mib(rc.change.after)
	memory > max_memory_mib
	msg := sprintf("%s asks for %d MiB of memory; the cap is %d MiB", [rc.address, memory, max_memory_mib])
}

deny contains msg if {
	some rc in planned
	n := cores(rc.change.after)
	n > max_cores
	msg := sprintf("%s asks for %d cores; the cap is %d", [rc.address, n, max_cores])
}
