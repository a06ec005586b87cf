// oncepay hosted checkout: Stripe Elements as the card form
// (data-card="stripe"). Stripe.js comes from Stripe's origin
// (data-stripe-js), loaded without holding up the page; it mounts the card
// field in Stripe's frame (#card-element) and makes the PaymentMethod whose
// id is all oncepay gets. Where it cannot load, the page says so and, in
// test mode, the test field still pays. Loaded before checkout.js, which
// calls window.oncepayCard (the interface is described there).
(function () {
  "use strict";
  window.oncepayCard = function (page) {
    var cardElement = document.getElementById("card-element");
    if (!cardElement) return null;
    var form = page.form;
    var T = page.T;
    var fieldError = page.fieldError;
    var stripe = null;
    var stripeCard = null;

    function elementsUnavailable() {
      stripeCard = null;
      cardElement.dataset.state = "unavailable";
      fieldError(cardElement, T.err_card_form);
    }
    if (form.dataset.stripeKey && form.dataset.stripeJs) {
      var stripeJs = document.createElement("script");
      stripeJs.src = form.dataset.stripeJs;
      stripeJs.async = true;
      stripeJs.onload = function () {
        try {
          stripe = window.Stripe(form.dataset.stripeKey, { locale: page.lang });
          stripeCard = stripe.elements({ locale: page.lang }).create("card");
          stripeCard.mount(cardElement);
          stripeCard.on("change", function (e) { fieldError(cardElement, e.error ? e.error.message : ""); });
          cardElement.dataset.state = "ready";
        } catch (e) { elementsUnavailable(); }
      };
      stripeJs.onerror = elementsUnavailable;
      document.head.appendChild(stripeJs);
    }

    return {
      fields: [cardElement],
      check: function () {
        if (!stripeCard) { fieldError(cardElement, T.err_card_form); return null; }
        return stripeCard;
      },
      // The card to Stripe, a PaymentMethod id back.
      token: function (element) {
        return stripe.createPaymentMethod({ type: "card", card: element }).then(function (result) {
          if (result.error) {
            fieldError(cardElement, result.error.message);
            throw new Error(result.error.message);
          }
          return result.paymentMethod.id;
        });
      }
    };
  };
})();
