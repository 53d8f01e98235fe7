# No VM or container is destroyed (alone or by a replacement) without a policy owner's
# approval: every such change is a failure the set's owners can approve.
package main

import rego.v1

deny contains msg if {
	some rc in guests
	destroyed(rc)
	msg := sprintf("%s would be %s: a guest is destroyed only with a policy owner's approval", [rc.address, what(rc)])
}

what(rc) := "replaced (destroyed and created again)" if {
	"create" in rc.change.actions
} else := "destroyed"
