// Reloads the console page periodically (data-refresh on <body>, in
// seconds) while it is visible. The pages work without it.
"use strict";
(function () {
  var secs = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
  if (!(secs > 0)) {
    return;
  }
  setInterval(function () {
    if (document.visibilityState === "visible") {
      window.location.reload();
    }
  }, secs * 1000);
})();
