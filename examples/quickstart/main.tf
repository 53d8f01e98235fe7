# planbot quickstart: an OpenTofu root that plans anywhere, with no provider download.
# A few "VMs" as terraform_data, a sensitive variable and an output.

terraform {
  required_version = ">= 1.4"
}

variable "vms" {
  description = "VMs to create: name => settings"
  type = map(object({
    node   = string
    cores  = number
    memory = number
  }))
  default = {
    blocky = { node = "pve01", cores = 2, memory = 2048 }
    gitlab = { node = "pve02", cores = 4, memory = 8192 }
    backup = { node = "pve01", cores = 1, memory = 1024 }
  }
}

variable "root_password" {
  description = "Initial root password of every VM"
  type        = string
  sensitive   = true
  default     = "quickstart-not-a-real-secret"
}

resource "terraform_data" "vm" {
  for_each = var.vms

  input = {
    name      = each.key
    node_name = each.value.node
    cores     = each.value.cores
    memory    = each.value.memory
    user_data = <<-YAML
      #cloud-config
      hostname: ${each.key}
      packages:
        - qemu-guest-agent
    YAML
  }
}

resource "terraform_data" "root_password" {
  input = var.root_password
}

output "vm_names" {
  value = sort(keys(terraform_data.vm))
}
