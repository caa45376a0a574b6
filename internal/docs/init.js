// Starts Swagger UI on the OpenAPI document named by the data-spec-url attribute
// of #swagger-ui. It lives in its own file, not inline in index.html, so that the
// page's Content-Security-Policy can allow only scripts served by the service.
window.addEventListener('load', function () {
  'use strict';
  var root = document.getElementById('swagger-ui');
  window.ui = SwaggerUIBundle({
    url: root.getAttribute('data-spec-url'),
    dom_id: '#swagger-ui',
    presets: [SwaggerUIBundle.presets.apis],
    layout: 'BaseLayout',
    deepLinking: true,
    // Keep the API key entered with "Authorize" across reloads (in localStorage).
    persistAuthorization: true,
    tryItOutEnabled: true,
    displayRequestDuration: true,
    // The default would send the document to validator.swagger.io.
    validatorUrl: null
  });
});
