"""Everything that runs untrusted code: the sandbox (namespaces, privileges dropped, system-call
filter, unprivileged uid), the warm fork server, and process supervision of its children."""
