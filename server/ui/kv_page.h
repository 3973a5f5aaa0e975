// The /ui page (server/ui/kv.html, compiled into the binary): draws the KV
// block pool, the requests and a timeline from GET /v1/kv/state, and sends
// prompts through /v1/completions. Self-contained: it loads nothing from
// elsewhere (KvPageCsp is the Content-Security-Policy served with it).
#pragma once

#include <string_view>

namespace kvserve::server {

// The HTML text of server/ui/kv.html.
[[nodiscard]] std::string_view KvPageHtml();

// No external resource: scripts and styles inline, fetches to this origin.
inline constexpr std::string_view kKvPageCsp =
    "default-src 'none'; script-src 'unsafe-inline'; style-src "
    "'unsafe-inline'; connect-src 'self'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

}  // namespace kvserve::server
