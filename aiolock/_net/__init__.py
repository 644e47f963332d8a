"""The network: connections, the wire protocol, pub/sub, topologies and the Lua scripts."""
