"""Client plumbing shared by vnode, the webhook and the descheduler (list+watch, queues)."""
