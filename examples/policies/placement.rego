# Guests only on these nodes, disks and files only on these storages. Change the lists to yours.
package main

import rego.v1

allowed_nodes := {"pve01", "pve02"}

allowed_storages := {"local", "local-lvm", "ceph"}

# The lists as the messages show them, written once for every failure.
nodes_text := concat(", ", sort(allowed_nodes))

storages_text := concat(", ", sort(allowed_storages))

deny contains msg if {
	some rc in planned
	name := node(rc.change.after)
	is_string(name)
	not name in allowed_nodes
	msg := sprintf("%s would run on node %s; allowed nodes: %s", [rc.address, name, nodes_text])
}

deny contains msg if {
	some rc in planned
	some storage in storages(rc.change.after)
	not storage in allowed_storages
	msg := sprintf("%s puts a disk on storage %s; allowed storages: %s", [rc.address, storage, storages_text])
}

# Files (snippets, images, ISOs) and downloads land on a storage too.
deny contains msg if {
	some rc in input.resource_changes
	rc.type in {"proxmox_virtual_environment_file", "proxmox_virtual_environment_download_file", "proxmox_download_file"}
	storage := rc.change.after.datastore_id
	is_string(storage)
	not storage in allowed_storages
	msg := sprintf("%s is stored on %s; allowed storages: %s", [rc.address, storage, storages_text])
}
