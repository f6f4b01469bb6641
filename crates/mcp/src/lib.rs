//! berth-mcp: the MCP server library (session and connector tool sets).
