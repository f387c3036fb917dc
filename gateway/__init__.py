"""The gateway: Greenlight's approvals for agents other than its own, as a second transport
beside bot/ (MCP at /mcp; never Slack: cards go out through the delivery the composition
root hands in)."""
