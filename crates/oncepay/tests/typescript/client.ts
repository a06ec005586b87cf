// A client of oncepay as a TypeScript shop would write one: types generated
// from openapi.yaml by openapi-typescript, calls made with openapi-fetch.
// Never run, only type-checked (`tsc --strict --noEmit`) by
// tests/api/schema.rs, next to the types generated into target/openapi-ts/.
// It calls every operation of the document (the test checks that each
// `client.METHOD("/path"` is here), and fails to compile if the document
// types a field loosely (`{}`, `unknown`, `any`) or wrongly.

import createClient from "openapi-fetch";
import type { components, operations, paths } from "./oncepay";

type Schemas = components["schemas"];

/** `true` when A and B are the same type: `any`, `unknown` and `never` equal only themselves. */
type Equals<A, B> =
  (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
/** Compiles only when its argument is `true`. */
function expectTrue<T extends true>(): T | undefined {
  return undefined;
}

// ---- What the generated types must say -------------------------------------

// An audit event's `change` has typed members (not `{}`), and others allowed.
type Change = Schemas["AuditEvent"]["change"];
expectTrue<Equals<Change["url"], string | undefined>>();
expectTrue<Equals<Change["events"], string[] | undefined>>();
expectTrue<Equals<Change["scopes"], ("read" | "write" | "admin")[] | undefined>>();
expectTrue<Equals<Change["prefix"], string | undefined>>();
expectTrue<Equals<Change["replaced_by"], string | undefined>>();
expectTrue<Equals<Change["expires_at"], string | null | undefined>>();
expectTrue<Equals<Change["deliveries_queued"], number | undefined>>();
expectTrue<Equals<Change["pending_deliveries_cancelled"], number | undefined>>();
type AuditIdentity = { issuer: string; jwks_url: string; audience: string; roles_claim: string };
expectTrue<
  Equals<
    Change["before"],
    { per_second: number | null; burst: number | null } | AuditIdentity | string | null | undefined
  >
>();

// `next_action`: `null`, a redirect, or Stripe.js's action with the intent's
// client secret, on a checkout attempt and a payment.
type Redirect = { type: "redirect"; url: string };
type UseStripeSdk = { type: "use_stripe_sdk"; client_secret: string };
expectTrue<Equals<Schemas["NextAction"], Redirect | UseStripeSdk | null>>();
expectTrue<Equals<NonNullable<Schemas["CheckoutAttempt"]>["next_action"], Redirect | UseStripeSdk | null>>();
// Missing from a payment answered (or evented) by a build before it.
expectTrue<Equals<Schemas["Payment"]["next_action"], Redirect | UseStripeSdk | null | undefined>>();
// A refund's `currency` likewise.
expectTrue<Equals<Schemas["Refund"]["currency"], string | undefined>>();

// One `Locale`, answered by the session; the request takes any case, a region and `auto`.
expectTrue<Equals<Schemas["Locale"], "en" | "ru" | "zh">>();
expectTrue<Equals<Schemas["CheckoutSession"]["locale"], "en" | "ru" | "zh" | null>>();

// Every path `{id}` is a string (a UUID); the checkout token too.
type PathOf<Op> = Op extends { parameters: { path: infer X } } ? X : never;
type PathParams<P extends keyof paths> = PathOf<paths[P]["get" | "post" | "delete"]>;
type IdPaths = Extract<keyof paths, `${string}{id}${string}`>;
expectTrue<Equals<keyof PathParams<IdPaths>, "id">>();
expectTrue<Equals<PathParams<IdPaths>["id"], string>>();
expectTrue<Equals<PathParams<"/checkout/{token}">["token"], string>>();
expectTrue<Equals<PathParams<"/webhooks/{provider}">["provider"], "sandbox" | "stripe">>();

// Every operation that can fail inside documents `500 internal_error`: only
// the static answers do not.
type Lacking500 = {
  [P in keyof paths]: {
    [M in "get" | "post" | "delete"]: paths[P][M] extends { responses: infer R }
      ? 500 extends keyof R
        ? never
        : `${Uppercase<M>} ${P & string}`
      : never;
  }["get" | "post" | "delete"];
}[keyof paths];
expectTrue<
  Equals<
    Lacking500,
    | "GET /checkout/assets/checkout.js"
    | "GET /checkout/assets/checkout.css"
    | "GET /checkout/assets/card_{provider}.js"
    | "GET /healthz"
    | "GET /readyz"
    | "GET /metrics"
    | "GET /openapi.yaml"
  >
>();
type Internal = NonNullable<operations["getOrder"]["responses"][500]["content"]>["application/problem+json"];
expectTrue<Equals<Internal, Schemas["Problem"]>>();

// The document itself is text (`text/yaml`).
expectTrue<Equals<keyof operations["openapi"]["responses"][200]["content"], "text/yaml">>();

// ---- Every operation, called -------------------------------------------------

const client = createClient<paths>({ baseUrl: "http://127.0.0.1:8080" });
const auth = { headers: { Authorization: "Bearer opk_..." } };

async function everyOperation(key: string): Promise<void> {
  const idem = { "Idempotency-Key": key };

  // Orders.
  const orders = await client.GET("/orders", {
    ...auth,
    params: { query: { limit: 10, status: "paid", customer_id: "cus_1" } },
  });
  const order = await client.POST("/orders", {
    ...auth,
    params: { header: idem },
    body: { customer_id: "cus_1", currency: "EUR", items: [{ sku: "book", quantity: 2, unit_amount: 1250 }] },
  });
  if (!order.data) return;
  const orderId: string = order.data.id;
  await client.GET("/orders/{id}", { ...auth, params: { path: { id: orderId } } });
  await client.POST("/orders/{id}/cancel", { ...auth, params: { path: { id: orderId }, header: idem } });
  await client.GET("/orders/{id}/payments", { ...auth, params: { path: { id: orderId } } });
  await client.GET("/orders/{id}/events", { ...auth, params: { path: { id: orderId } } });
  // @ts-expect-error a path id is a string, not a number
  await client.GET("/orders/{id}", { ...auth, params: { path: { id: 42 } } });
  void orders.data?.has_more;

  // Checkout.
  const session = await client.POST("/orders/{id}/checkout", {
    ...auth,
    params: { path: { id: orderId }, header: idem },
    body: { success_url: "https://shop.example/thanks", locale: "ru-RU" },
  });
  if (!session.data) return;
  const locale: "en" | "ru" | "zh" | null = session.data.locale;
  void locale;
  const token = session.data.url.split("/").pop() ?? "";
  const page = await client.GET("/checkout/{token}", { params: { path: { token } }, parseAs: "text" });
  const html: string | undefined = page.data;
  void html;
  await client.POST("/checkout/{token}/payments", {
    params: { path: { token }, header: idem },
    body: { payment_method: "tok_visa" },
  });
  const status = await client.GET("/checkout/{token}/status", { params: { path: { token }, query: { key } } });
  const latest = status.data?.latest;
  if (latest?.next_action) {
    const kind: "redirect" | "use_stripe_sdk" = latest.next_action.type;
    void kind;
    if (latest.next_action.type === "redirect") {
      const url: string = latest.next_action.url;
      void url;
    } else {
      const secret: string = latest.next_action.client_secret;
      void secret;
    }
    // @ts-expect-error `redirect` and `use_stripe_sdk` are the only kinds of next action
    void (latest.next_action.type === "wait");
  }
  await client.GET("/checkout/assets/checkout.js", { parseAs: "text" });
  await client.GET("/checkout/assets/checkout.css", { parseAs: "text" });
  await client.GET("/checkout/assets/card_{provider}.js", { params: { path: { provider: "sandbox" } }, parseAs: "text" });

  // Payments.
  await client.GET("/payments", { ...auth, params: { query: { order_id: orderId, status: "pending" } } });
  const payment = await client.POST("/payments", {
    ...auth,
    params: { header: idem },
    body: { order_id: orderId, payment_method: "tok_3ds", return_url: "https://shop.example/back" },
  });
  if (!payment.data) return;
  const paymentId: string = payment.data.id;
  // A replay stored by an earlier build may lack `next_action`: read it as null.
  const action = payment.data.next_action ?? null;
  if (action !== null && action.type === "redirect") {
    const to: string = action.url;
    void to;
  } else if (action !== null) {
    // Stripe.js: stripe.handleNextAction({ clientSecret: action.client_secret }).
    const clientSecret: string = action.client_secret;
    void clientSecret;
  }
  await client.GET("/payments/{id}", { ...auth, params: { path: { id: paymentId } } });
  await client.GET("/payments/{id}/events", { ...auth, params: { path: { id: paymentId } } });

  // Authorize now, capture later.
  const hold = await client.POST("/payments", {
    ...auth,
    params: { header: idem },
    body: { order_id: orderId, payment_method: "tok_visa", capture_method: "manual" },
  });
  if (hold.data && hold.data.status === "requires_capture") {
    const capturable: number = hold.data.amount_capturable;
    const before: string | null = hold.data.capture_before;
    void before;
    const captured = await client.POST("/payments/{id}/capture", {
      ...auth,
      params: { path: { id: hold.data.id }, header: idem },
      body: { amount: capturable },
    });
    const reason: string | null | undefined = captured.data?.void_reason;
    void reason;
    await client.POST("/payments/{id}/void", {
      ...auth,
      params: { path: { id: hold.data.id }, header: idem },
      body: {},
    });
  }

  // Refunds.
  const refund = await client.POST("/payments/{id}/refunds", {
    ...auth,
    params: { path: { id: paymentId }, header: idem },
    body: { amount: 100, reason: "damaged" },
  });
  if (!refund.data) return;
  // @ts-expect-error a replayed refund stored by an earlier build may lack `currency`
  const strict: string = refund.data.currency;
  void strict;
  const currency: string = refund.data.currency ?? payment.data.currency;
  void currency;
  const refundId: string = refund.data.id;
  await client.GET("/refunds", { ...auth, params: { query: { payment_id: paymentId } } });
  await client.GET("/refunds/{id}", { ...auth, params: { path: { id: refundId } } });
  await client.GET("/refunds/{id}/events", { ...auth, params: { path: { id: refundId } } });

  // Customer balances: credit, debit, hold, capture, release, reads.
  const customer = { customer_id: "cus_42" };
  const credit = await client.POST("/customers/{customer_id}/balance/credits", {
    ...auth,
    params: { path: customer, header: idem },
    body: { amount: 1000, currency: "EUR", description: "goodwill" },
  });
  if (!credit.data) return;
  const after: number = credit.data.balance.available;
  void after;
  await client.POST("/customers/{customer_id}/balance/debits", {
    ...auth,
    params: { path: customer, header: idem },
    body: { amount: 100, currency: "EUR" },
  });
  const balanceHold = await client.POST("/customers/{customer_id}/balance/holds", {
    ...auth,
    params: { path: customer, header: idem },
    body: { amount: 100, currency: "EUR", expires_in: 600 },
  });
  if (!balanceHold.data) return;
  const holdId: string = balanceHold.data.id;
  await client.GET("/balance_holds/{id}", { ...auth, params: { path: { id: holdId } } });
  await client.POST("/balance_holds/{id}/capture", { ...auth, params: { path: { id: holdId }, header: idem }, body: { amount: 50 } });
  await client.POST("/balance_holds/{id}/release", { ...auth, params: { path: { id: holdId }, header: idem } });
  await client.GET("/customers/{customer_id}/balance", { ...auth, params: { path: customer, query: { currency: "EUR" } } });
  await client.GET("/customers/{customer_id}/balance/transactions", { ...auth, params: { path: customer, query: { currency: "EUR", limit: 10 } } });
  await client.GET("/balance_transactions/{id}", { ...auth, params: { path: { id: credit.data.id } } });

  // Stock: count in, read, list; an order that reserves it.
  const sku = { sku: "book" };
  const counted = await client.POST("/inventory/{sku}/adjustments", {
    ...auth,
    params: { path: sku, header: idem },
    body: { quantity: 10, reason: "delivery" },
  });
  if (!counted.data) return;
  const onHand: number = counted.data.on_hand - counted.data.reserved;
  void onHand;
  await client.GET("/inventory/{sku}", { ...auth, params: { path: sku } });
  await client.GET("/inventory", { ...auth, params: { query: { limit: 10, starting_after: "a" } } });
  const reserving = await client.POST("/orders", {
    ...auth,
    params: { header: idem },
    body: {
      customer_id: "cus_42",
      currency: "EUR",
      items: [{ sku: "book", quantity: 2, unit_amount: 1250 }],
      reserve_stock: true,
    },
  });
  if (!reserving.data) return;
  const until: string | null = reserving.data.stock_reserved_until;
  const short: number = reserving.data.stock_shortfall.length;
  void until;
  void short;

  // Disputes (opened by the provider; read only).
  const disputes = await client.GET("/disputes", {
    ...auth,
    params: { query: { status: "needs_response", payment_id: paymentId } },
  });
  const disputeId: string | undefined = disputes.data?.data[0]?.id;
  if (disputeId) {
    const dispute = await client.GET("/disputes/{id}", { ...auth, params: { path: { id: disputeId } } });
    const status: "needs_response" | "under_review" | "won" | "lost" | undefined = dispute.data?.status;
    void status;
  }

  // Provider webhooks.
  await client.POST("/webhooks/{provider}", {
    params: {
      path: { provider: "sandbox" },
      header: { "webhook-id": "evt_1", "webhook-timestamp": "1700000000", "webhook-signature": "v1,..." },
    },
    body: { type: "charge.succeeded", data: { object: { id: "ch_1", status: "succeeded" } } },
  });

  // API keys and the audit trail.
  await client.GET("/api_keys", auth);
  const created = await client.POST("/api_keys", { ...auth, params: { header: idem }, body: { scopes: ["read"], expire_current_in_seconds: 3600 } });
  if (created.data) {
    const secret: string = created.data.key;
    void secret;
    await client.DELETE("/api_keys/{id}", { ...auth, params: { path: { id: created.data.id } } });
  }
  const audit = await client.GET("/audit_events", { ...auth, params: { query: { action: "webhook_endpoint.created" } } });
  for (const event of audit.data?.data ?? []) {
    const url: string | undefined = event.change.url;
    const events: string[] | undefined = event.change.events;
    const scopes: Schemas["Scope"][] | undefined = event.change.scopes;
    const before = event.change.before;
    if (typeof before === "object" && before !== null) {
      if ("per_second" in before) {
        const perSecond: number | null = before.per_second;
        void perSecond;
      } else {
        const issuer: string = before.issuer;
        void issuer;
      }
    }
    // @ts-expect-error `url` is a string, never a number
    const wrong: number | undefined = event.change.url;
    void [url, events, scopes, wrong];
  }

  // Webhook endpoints and events.
  await client.GET("/webhook_endpoints", auth);
  const endpoint = await client.POST("/webhook_endpoints", {
    ...auth,
    params: { header: idem },
    body: { url: "https://shop.example/oncepay/events", events: ["payment.succeeded", "*"] },
  });
  if (endpoint.data) {
    const whsec: string = endpoint.data.secret;
    void whsec;
    await client.DELETE("/webhook_endpoints/{id}", { ...auth, params: { path: { id: endpoint.data.id } } });
  }
  const events = await client.GET("/events", { ...auth, params: { query: { type: "refund.succeeded", object_id: refundId } } });
  const eventId = events.data?.data[0]?.id ?? "";
  const event = await client.GET("/events/{id}", { ...auth, params: { path: { id: eventId } } });
  void event.data?.attempts[0]?.latency_ms;
  await client.POST("/events/{id}/redeliver", { ...auth, params: { path: { id: eventId } } });

  // Operations.
  await client.GET("/healthz");
  await client.GET("/readyz");
  await client.GET("/metrics", { parseAs: "text" });
  const document = await client.GET("/openapi.yaml", { parseAs: "text" });
  const yaml: string | undefined = document.data;
  void yaml;

  // An error is the problem document, whatever the status.
  const missing = await client.GET("/refunds/{id}", { ...auth, params: { path: { id: refundId } } });
  if (missing.error) {
    const code: Schemas["Problem"]["code"] = missing.error.code;
    void code;
  }
}

void everyOperation;
