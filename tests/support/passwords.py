"""Password hashing for the users tests make.

Django's PBKDF2 runs a million rounds by design: 0.1–0.2 s of CPU per user made, on
every test that makes alice, bob or staff, a minute and more of each CI pass on 2 cores.
One round instead, under the same algorithm's name: the hash names its own round count,
so the servers tests start (daphne, qcluster, with Django's own hashers) verify these
passwords too, and upgrade one to the full count as a login would.
"""

from __future__ import annotations

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class OneRoundPBKDF2(PBKDF2PasswordHasher):
    iterations = 1
