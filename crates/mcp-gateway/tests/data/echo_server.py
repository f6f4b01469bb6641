"""A stdio MCP server in plain Python (stdlib only), for the gateway's tests.

    python3 echo_server.py [PREFIX]

Resources: `echo://<PREFIX>readme` (text). Prompts: `<PREFIX>greet` (argument `name`).
Tools: `<PREFIX>echo` answers its `text` argument; `<PREFIX>info` answers a JSON object
with the working directory, `$GREETING`, the contents of `installed.txt` in the working
directory (what an install_cmd wrote), whether the gateway's token leaked into the
environment, and its process id. Speaks newline-delimited JSON-RPC on stdin/stdout and answers the protocol
version the client asks for.
"""

import json
import os
import sys

PREFIX = sys.argv[1] if len(sys.argv) > 1 else ""

TOOLS = [
    {
        "name": PREFIX + "echo",
        "description": "Answers its text.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    },
    {
        "name": PREFIX + "info",
        "description": "Where and how this server runs.",
        "inputSchema": {"type": "object", "properties": {}},
    },
]


README_URI = f"echo://{PREFIX}readme"


def info() -> str:
    try:
        with open("installed.txt") as marker:
            installed = marker.read().strip()
    except OSError:
        installed = None
    return json.dumps({
        "cwd": os.getcwd(),
        "greeting": os.environ.get("GREETING"),
        "installed": installed,
        "token_visible": "GATEWAY_ACCESS_TOKEN" in os.environ,
        "pid": os.getpid(),
    })


def answer(request: dict) -> dict:
    method = request.get("method")
    params = request.get("params") or {}
    if method == "initialize":
        return {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}, "resources": {}, "prompts": {}},
            "serverInfo": {"name": "echo-server", "version": "1.0.0"},
        }
    if method == "ping":
        return {}
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "resources/list":
        return {"resources": [{"uri": README_URI, "name": PREFIX + "readme", "mimeType": "text/plain"}]}
    if method == "resources/templates/list":
        return {"resourceTemplates": []}
    if method == "resources/read":
        if params.get("uri") != README_URI:
            raise LookupError(f"unknown resource {params.get('uri')}")
        return {"contents": [{"uri": README_URI, "mimeType": "text/plain", "text": f"readme of {PREFIX or 'echo'}"}]}
    if method == "prompts/list":
        return {"prompts": [{"name": PREFIX + "greet", "arguments": [{"name": "name", "required": True}]}]}
    if method == "prompts/get":
        if params.get("name") != PREFIX + "greet":
            raise LookupError(f"unknown prompt {params.get('name')}")
        who = (params.get("arguments") or {}).get("name", "nobody")
        return {"messages": [{"role": "user", "content": {"type": "text", "text": f"greet {who}"}}]}
    if method == "tools/call":
        name = params.get("name")
        arguments = params.get("arguments") or {}
        if name == PREFIX + "echo":
            text = str(arguments.get("text", ""))
        elif name == PREFIX + "info":
            text = info()
        else:
            raise LookupError(f"unknown tool {name}")
        return {"content": [{"type": "text", "text": text}], "isError": False}
    raise NotImplementedError(method)


def main() -> None:
    print(f"echo server {PREFIX!r} starting in {os.getcwd()}", file=sys.stderr, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if "id" not in request:
            continue  # a notification
        try:
            reply = {"jsonrpc": "2.0", "id": request["id"], "result": answer(request)}
        except NotImplementedError as error:
            reply = {"jsonrpc": "2.0", "id": request["id"],
                     "error": {"code": -32601, "message": f"method not found: {error}"}}
        except LookupError as error:
            reply = {"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32602, "message": str(error)}}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
