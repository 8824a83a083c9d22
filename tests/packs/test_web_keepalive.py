"""The provider-side poster never reuses a connection the web server may be closing.

gunicorn closes a keep-alive connection idle for ``--keep-alive`` seconds; a client that kept it longer could
send a delivery on a socket being closed and get a reset instead of an answer (seen once in the hot-account
plan: ``ReadError: Connection reset by peer``). Structural: the server's setting and the client's are checked,
not a race timed with sleeps.
"""
from packs.demo.common import KEEPALIVE_SECONDS, web_server_argv
from packs.demo.run import TimedPoster


def test_the_poster_drops_an_idle_connection_before_the_web_server_does():
    argv = web_server_argv(8000, workers=1)
    assert argv[argv.index("--keep-alive") + 1] == str(KEEPALIVE_SECONDS)
    with TimedPoster(url="http://127.0.0.1:8000/", secret=b"s") as poster:
        expiry = poster._http._transport._pool._keepalive_expiry
    assert expiry is not None and 0 < expiry < KEEPALIVE_SECONDS
