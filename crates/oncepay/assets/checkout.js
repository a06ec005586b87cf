// oncepay hosted checkout: one payment intent per order, one key per intent.
//
// The rules (the design notes' UI patterns):
// - the key is made at the first click and written to sessionStorage
//   (per order) BEFORE the request leaves;
// - until a final status, the button stays busy (aria-busy, focusable, its
//   label says what is happening) and clicks, Enter and submits send nothing;
// - a timeout or a lost answer moves to "checking": the status is polled
//   with backoff, and the request is sent again with the SAME key when the
//   server has no record of it; a reload with a stored key does the same;
// - succeeded shows a receipt, no Pay button, and forgets the key;
// - failed shows the reason and allows a new attempt with a NEW key.
// The server decides anyway: one order, one live attempt.
(function () {
  "use strict";
  var form = document.getElementById("checkout");
  if (!form) return;
  var input = document.getElementById("payment_method");
  var button = document.getElementById("pay");
  var status = document.getElementById("status");
  var receipt = document.getElementById("receipt");
  var token = form.dataset.token;
  var base = "/checkout/" + encodeURIComponent(token);
  var storageKey = "oncepay-checkout:" + form.dataset.order;
  var payLabel = button.textContent;
  var busy = false;

  function saved() {
    try { return JSON.parse(window.sessionStorage.getItem(storageKey) || "null"); }
    catch (e) { return null; }
  }
  function remember(intent) { window.sessionStorage.setItem(storageKey, JSON.stringify(intent)); }
  function forget() { window.sessionStorage.removeItem(storageKey); }

  function newKey() {
    if (window.crypto && window.crypto.randomUUID) return window.crypto.randomUUID();
    var bytes = new Uint8Array(16);
    window.crypto.getRandomValues(bytes);
    return Array.prototype.map.call(bytes, function (b) { return ("0" + b.toString(16)).slice(-2); }).join("");
  }

  function show(state, text) {
    status.dataset.status = state;
    status.textContent = text;
    document.body.dataset.status = state;
  }

  function setBusy(label) {
    busy = true;
    button.setAttribute("aria-busy", "true");
    button.setAttribute("aria-disabled", "true");
    button.classList.add("busy");
    button.textContent = label;
    input.readOnly = true;
  }

  function setIdle() {
    busy = false;
    button.removeAttribute("aria-busy");
    button.removeAttribute("aria-disabled");
    button.classList.remove("busy");
    button.textContent = payLabel;
    input.readOnly = false;
  }

  function succeeded(payment) {
    forget();
    busy = true;
    form.hidden = true;
    receipt.hidden = false;
    if (payment && payment.id) document.getElementById("receipt-id").textContent = payment.id;
    var title = document.querySelector("h1");
    if (title && title.firstChild) title.firstChild.textContent = "Paid ";
    show("succeeded", "Payment succeeded. You can close this page.");
  }

  function failed(payment) {
    forget();
    setIdle();
    var reason = (payment && (payment.failure_message || payment.failure_code)) || "The payment was declined.";
    show("failed", "Payment failed: " + reason + " You can try again with another card.");
    input.focus();
  }

  function checking() {
    setBusy("Checking payment status…");
    show("checking", "Checking the payment status. Please do not pay again.");
  }

  function sleep(ms) { return new Promise(function (r) { window.setTimeout(r, ms); }); }

  function timed(url, options, ms) {
    var controller = new AbortController();
    var timer = window.setTimeout(function () { controller.abort(); }, ms);
    options.signal = controller.signal;
    options.credentials = "same-origin";
    options.cache = "no-store";
    return window.fetch(url, options).finally(function () { window.clearTimeout(timer); });
  }

  // Sends the intent's request: a final answer ends it; anything else
  // (timeout, lost answer, 5xx, in flight) moves to checking.
  function send(intent) {
    return timed(base + "/payments", {
      method: "POST",
      headers: { "Content-Type": "application/json", "Idempotency-Key": intent.key },
      body: JSON.stringify({ payment_method: intent.method })
    }, 8000).then(function (r) {
      return r.json().catch(function () { return {}; }).then(function (body) {
        if (r.status === 201 || r.status === 202) {
          if (body.status === "succeeded") return succeeded(body);
          if (body.status === "failed") return failed(body);
          return poll(intent);
        }
        if (r.status === 409 && body.code === "order_not_payable") return poll(intent);
        if (r.status >= 500 || r.status === 409 || r.status === 429) return poll(intent);
        if (r.status === 410 || r.status === 404) {
          forget();
          busy = true;
          show("failed", "This checkout link is no longer valid.");
          return;
        }
        failed({ failure_message: body.detail || "The payment could not be made." });
      });
    }, function () { return poll(intent); });
  }

  // Polls the status with backoff until the outcome is known; sends the
  // same request again (same key) while the server has no record of it.
  function poll(intent) {
    checking();
    var pause = 400;
    var resent = 0;
    function round() {
      return timed(base + "/status?key=" + encodeURIComponent(intent.key), { method: "GET" }, 8000)
        .then(function (r) { return r.ok ? r.json() : null; }, function () { return null; })
        .then(function (s) {
          if (s) {
            if (s.attempt && s.attempt.status === "succeeded") return succeeded(s.attempt);
            if (s.order_status === "paid") return succeeded(s.latest);
            if (s.attempt && s.attempt.status === "failed") return failed(s.attempt);
            if (!s.attempt && (!s.latest || s.latest.status !== "pending") && resent < 5) {
              resent += 1;
              return send(intent);
            }
          }
          return sleep(pause).then(function () { pause = Math.min(pause * 2, 4000); return round(); });
        });
    }
    return round();
  }

  function start(event) {
    if (event) event.preventDefault();
    if (busy) return;
    var method = input.value.trim();
    if (!method) { show("failed", "Enter a card token."); input.focus(); return; }
    var intent = { key: newKey(), method: method };
    remember(intent);             // before anything leaves
    setBusy("Processing payment…");
    show("processing", "Processing the payment…");
    send(intent);
  }

  form.addEventListener("submit", start);
  button.addEventListener("click", function (event) {
    if (busy) { event.preventDefault(); }
  });

  if (form.dataset.initial === "succeeded") {
    succeeded(null);
    return;
  }
  var pending = saved();
  if (pending && pending.key) {
    input.value = pending.method;
    poll(pending);
  }
})();
