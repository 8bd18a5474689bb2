"""The live page: what an operator sees in a browser.

* :mod:`~aggregator.page.live_page`: the one self-contained HTML document (script and
  styles inline, nothing loaded from outside) and its content security policy;
* :mod:`~aggregator.page.page_data`: what it shows, computed on the server: the dimensions
  as sensor channels in physical units, and the history of the privacy level.

They change with the page. The service serves it (:mod:`aggregator.service.http`) and
fills it (:mod:`aggregator.service.publishing`); the demo (:mod:`sim.demo`) names its
channels.

May import: ``edge``, numpy and the standard library; nothing else of the aggregator.
"""
