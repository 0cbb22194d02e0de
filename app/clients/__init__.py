"""Clients of Sandhive's own HTTP API that ship with the server: the MCP server, the
Gymnasium-like episode environments and the demo's client. They never import the layers
behind the API: what they know of Sandhive is what crosses HTTP.
"""
