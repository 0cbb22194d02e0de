// Starts Swagger UI on /docs (app/api/docs.py). A file of its own, not an inline
// script, so the page's Content-Security-Policy can stay `script-src 'self'`.
"use strict";

const root = document.getElementById("swagger-ui");
window.ui = SwaggerUIBundle({
  url: root.dataset.openapiUrl,
  dom_id: "#swagger-ui",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  validatorUrl: null, // its default is a public validator: /docs asks no other host
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  layout: "BaseLayout",
});
