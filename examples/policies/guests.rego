# What planbot's example policies call a Proxmox guest, and how to read its size and place
# from a resource change, for the bpg provider (proxmox_virtual_environment_* and the newer
# proxmox_*) and for Telmate's (proxmox_vm_qemu, proxmox_lxc).
package main

import rego.v1

vm_types := {
	"proxmox_virtual_environment_vm",
	"proxmox_vm",
	"proxmox_vm_qemu",
}

container_types := {
	"proxmox_virtual_environment_container",
	"proxmox_lxc",
}

guest_types := vm_types | container_types

# The managed guests this plan changes (`some rc in guests` walks them). A list, not an
# object keyed by address: the plan lists each address once, and a list is built in a
# fraction of the time on a plan of thousands of guests.
guests := [rc |
	some rc in input.resource_changes
	rc.mode == "managed"
	rc.type in guest_types
]

# Created, updated or replaced: what the guest will look like.
planned := [rc |
	some rc in guests
	rc.change.after != null
]

# Destroyed, also as part of a replacement.
destroyed(rc) if "delete" in rc.change.actions

# Memory in MiB: bpg's `memory { dedicated }` block (a list in show -json), or a number.
memory_mib(after) := after.memory[0].dedicated if is_array(after.memory)
else := after.memory.dedicated if is_object(after.memory)
else := after.memory if is_number(after.memory)

# Cores: bpg's `cpu { cores, sockets }` block (a list, or an object in the newer resources),
# or Telmate's `cores` and `sockets`.
cores(after) := after.cpu[0].cores * object.get(after.cpu[0], "sockets", 1) if is_array(after.cpu)
else := after.cpu.cores * object.get(after.cpu, "sockets", 1) if is_object(after.cpu)
else := after.cores * object.get(after, "sockets", 1) if is_number(after.cores)

# The node a guest runs on (bpg: node_name; Telmate: target_node).
node(after) := after.node_name if is_string(after.node_name)
else := after.target_node

# Every storage a guest's disks use (bpg: disk[].datastore_id; Telmate: disk[].storage).
storages(after) := {id |
	some d in object.get(after, "disk", [])
	some key in ["datastore_id", "storage"]
	id := d[key]
	is_string(id)
}
