"""``keyqueue.informer`` against the lab's API server on a real etcd."""
