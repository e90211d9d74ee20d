"""Offline filtering (``swarmrl filter``): keep the training tasks whose solve rate under the policy lies in a
band, so groups carry signal (``offline``)."""
