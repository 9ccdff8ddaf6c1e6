// Loaded on pages with saved widget state, after require.js and before the widget manager (nb_ipywidgets_js in
// _config.yml).
(function () {
  // The widget manager finds its CSS's font files beside the AMD module that defines it; without a path for that
  // module, require.js would resolve it next to the page. content_root is the site root relative to this page.
  var root = document.documentElement.dataset.content_root || "";
  window.requirejs.config({
    paths: { "@jupyter-widgets/html-manager/dist": root + "_static/vendor/html-manager" },
  });
  // ipywidgets' controls typeset a widget's description with MathJax 2's MathJax.Hub.Queue whenever MathJax is on
  // the page; the site loads MathJax 3, whose API is typesetPromise. Bridge the one call they make.
  function bridge() {
    var mj = window.MathJax;
    if (mj && !mj.Hub && mj.typesetPromise) {
      mj.Hub = {
        Queue: function (job) {
          var element = job[2];
          return mj.startup.promise.then(function () {
            return mj.typesetPromise([element]);
          });
        },
      };
    }
  }
  // MathJax is loaded deferred: it is there by the time the load event fires, which is when the widgets render.
  window.addEventListener("load", bridge);
})();
