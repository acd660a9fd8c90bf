"""Identity without a directory: the auth config's errors (one line, file and key line), tokens (hash only,
scope, expiry, revocation), sessions (idle and absolute expiry), the login limits, the proxy header's trust.
The LDAP bind itself is tested against a real slapd (tests/integration/test_auth.py)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from hpcwatch.access.authconfig import LoginConfig, SessionConfig, parse_auth_text, roles_for
from hpcwatch.access.identity import Identity
from hpcwatch.access.ldap import LdapAuthenticator, valid_login_name
from hpcwatch.access.sessions import LoginLimiter, SessionStore
from hpcwatch.access.tokens import TokenStore, parse_duration
from hpcwatch.errors import ConfigError, InputError

LDAP = '[ldap]\nurl = "ldap://127.0.0.1:1"\nuser_dn = "uid={user},ou=people,dc=x"\n'


@pytest.mark.parametrize(
    "text, message",
    [
        ('[ldap]\nurl = "ldap://h"\nuser_dn = "uid={user}"\nbind_pw = "x"\n', ":4: unknown key 'bind_pw' in [ldap]"),
        ('[ldap]\nurl = "http://h"\nuser_dn = "uid={user}"\n', ":2: url must start with ldap:// or ldaps://"),
        ('[ldap]\nurl = "ldap://h"\nuser_dn = "uid=alice"\n', ":3: user_dn must contain {user}"),
        ('[ldap]\nurl = "ldap://h"\n', ":1: [ldap] needs user_dn (a template) or search_base"),
        ('[ldap]\nuser_dn = "uid={user}"\n', ":1: [ldap] needs url"),
        ('[ldap]\nurl = "ldap://h"\nuser_dn = "uid={user}"\ntimeout_s = "5"\n', ":4: timeout_s must be float"),
        ('[proxy]\ntrusted = ["10.0.0.0/33"]\n', ":2: trusted: '10.0.0.0/33' is not an address or CIDR"),
        ('[proxy]\nheader = "X Remote: User"\n', ":2: header must be a header name"),
        ('[tokens]\nfile = "t.json"\n[roles]\nadmin = ["alice"]\n', ":4: unknown role 'admin'"),
        ('[tokens]\nfile = "t.json"\n[login]\nlockout_failures = 0\n', ":4: lockout_failures must be > 0"),
        ('[tokens]\nfile = "t.json"\n\n[sesion]\nidle_minutes = 3\n', ":4: unknown table [sesion]"),
        ("[session]\nidle_minutes = 3\n", ":1: no way in"),
        ("[ldap\n", "auth.toml: "),
    ],
)
def test_a_wrong_auth_config_is_one_line_naming_file_and_line(text, message):
    with pytest.raises(ConfigError) as err:
        parse_auth_text(text, path="auth.toml")
    assert f"auth.toml{message}" in str(err.value) or message in str(err.value)
    assert "\n" not in str(err.value)


def test_serve_with_a_bad_auth_file_exits_2_with_one_line(tmp_path):
    bad = tmp_path / "auth.toml"
    bad.write_text('[proxy]\ntrusted = ["not-an-address"]\n')
    run = subprocess.run(
        [sys.executable, "-m", "hpcwatch", "serve", "--auth", str(bad), "--db", str(tmp_path / "s")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"hpcwatch: {bad}:2: trusted: 'not-an-address' is not an address or CIDR"
    ]


def test_roles_come_from_users_and_groups_and_everyone_is_a_user():
    config = parse_auth_text(LDAP + '[roles]\noperator = ["alice", "@HPC-Admins"]\nsecurity = ["@cn=sec,dc=x"]\n')
    assert roles_for(config, "bob") == {"user"}
    assert roles_for(config, "alice") == {"user", "operator"}
    assert roles_for(config, "carol", frozenset({"hpc-admins", "cn=SEC,dc=x"})) == {"user", "operator", "security"}
    assert roles_for(None, "anyone") == {"user"}


# -- tokens --------------------------------------------------------------------------------------------------


def test_a_token_is_shown_once_and_only_its_hash_is_stored(tmp_path):
    store = TokenStore(tmp_path / "tokens.json")
    text, entry = store.create("alice", "metrics", parse_duration("30d"), now=1000.0)
    secret = text.split("_", 2)[2]
    on_disk = (tmp_path / "tokens.json").read_text()
    assert secret not in on_disk and entry.sha256 in on_disk
    assert os.stat(tmp_path / "tokens.json").st_mode & 0o777 == 0o600
    assert store.verify(text, now=1001.0) == entry
    assert TokenStore(tmp_path / "tokens.json").verify(text, now=1001.0) == entry  # another process reads it
    assert entry.expires == 1000.0 + 30 * 86400


def test_an_expired_revoked_forged_or_malformed_token_is_refused(tmp_path):
    store = TokenStore(tmp_path / "tokens.json")
    text, entry = store.create("alice", "api", 60, now=1000.0)
    assert store.verify(text, now=1061.0) is None  # expired
    forged = text[:-1] + ("A" if text[-1] != "A" else "B")
    assert store.verify(forged, now=1001.0) is None
    for junk in ("", "hpcw_", "Bearer " + text, text + "x", "hpcw_" + "0" * 16 + "_" + "a" * 43):
        assert store.verify(junk, now=1001.0) is None
    store.revoke(entry.id, now=1002.0)
    assert store.verify(text, now=1001.0) is None
    assert [e.revoked for e in store.entries()] == [1002.0]
    with pytest.raises(InputError, match="no token 'nope'"):
        store.revoke("nope")


def test_token_scope_and_user_are_checked(tmp_path):
    identity = Identity(parse_auth_text(f'[tokens]\nfile = "{tmp_path}/t.json"\n[roles]\noperator = ["ops"]\n'))
    assert identity.tokens is not None
    text, _ = identity.tokens.create("ops", "metrics", 3600)
    principal = identity.from_bearer(f"Bearer {text}", "metrics")
    assert principal is not None and principal.name == "ops" and principal.via == "token"
    assert principal.scopes == {"metrics"} and principal.roles == {"user", "operator"}
    assert identity.from_bearer(f"Bearer {text}", "api") is None
    assert identity.from_bearer(f"Basic {text}", "metrics") is None
    with pytest.raises(InputError):
        identity.tokens.create("a b", "api", 60)
    with pytest.raises(InputError):
        parse_duration("30 days")


def test_hpcwatch_token_create_list_revoke(tmp_path):
    auth = tmp_path / "auth.toml"
    auth.write_text(f'[tokens]\nfile = "{tmp_path}/t.json"\n')

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "hpcwatch", "token", *argv, "--auth", str(auth)], capture_output=True, text=True
        )

    created = run("create", "--user", "prom", "--scope", "metrics", "--expires", "1d")
    assert created.returncode == 0 and created.stdout.startswith("hpcw_")
    listed = json.loads(run("list", "--json").stdout)
    assert [(t["user"], t["scope"], t["revoked"]) for t in listed] == [("prom", "metrics", None)]
    assert "sha256" not in listed[0]
    assert run("revoke", listed[0]["id"]).returncode == 0
    assert json.loads(run("list", "--json").stdout)[0]["revoked"] is not None


# -- sessions and the login limits -----------------------------------------------------------------------------


def test_a_session_ends_when_idle_too_long_and_after_its_absolute_lifetime():
    sessions = SessionStore(SessionConfig(idle_minutes=10, absolute_hours=1))
    s = sessions.create("alice", frozenset({"user"}), now=0.0)
    assert sessions.get(s.id, now=599.0) is s  # each request restarts the idle clock
    assert sessions.get(s.id, now=1190.0) is s
    assert sessions.get(s.id, now=1790.0) is s
    assert sessions.get(s.id, now=3601.0) is None  # active all along, still over an hour
    idle = sessions.create("bob", frozenset({"user"}), now=0.0)
    assert sessions.get(idle.id, now=601.0) is None
    assert sessions.get("made-up", now=1.0) is None and sessions.get(None) is None


def test_a_user_is_locked_out_after_n_failures_and_the_lock_ends_by_itself():
    limiter = LoginLimiter(LoginConfig(per_address_per_minute=100, lockout_failures=3, lockout_minutes=5))
    for i in range(3):
        assert limiter.check("10.0.0.1", "carol", now=float(i)).allowed
        locked = limiter.failed("carol", now=float(i))
    assert locked
    verdict = limiter.check("10.0.0.2", "carol", now=10.0)  # from any address
    assert (verdict.allowed, verdict.why) == (False, "locked") and verdict.retry_after_s > 280
    assert limiter.check("10.0.0.1", "dave", now=10.0).allowed
    assert limiter.check("10.0.0.1", "carol", now=3 + 301.0).allowed


def test_logins_from_one_address_are_rate_limited_per_minute():
    limiter = LoginLimiter(LoginConfig(per_address_per_minute=3, lockout_failures=100, lockout_minutes=1))
    assert all(limiter.check("10.0.0.1", f"u{i}", now=float(i)).allowed for i in range(3))
    assert limiter.check("10.0.0.1", "u9", now=5.0).why == "rate"
    assert limiter.check("10.0.0.2", "u9", now=5.0).allowed
    assert limiter.check("10.0.0.1", "u9", now=61.0).allowed


# -- the proxy's header ----------------------------------------------------------------------------------------


def test_the_proxy_header_counts_only_from_a_trusted_address(caplog):
    identity = Identity(parse_auth_text('[proxy]\nheader = "X-Remote-User"\ntrusted = ["10.1.0.0/16", "::1"]\n'))
    principal = identity.from_proxy("alice", "10.1.2.3")
    assert principal is not None and (principal.name, principal.via) == ("alice", "proxy")
    assert identity.from_proxy("alice", "::1") is not None
    with caplog.at_level(logging.WARNING):
        assert identity.from_proxy("alice", "192.168.0.9") is None
        assert identity.from_proxy("alice", "192.168.0.9") is None
        assert identity.from_proxy("alice", "testclient") is None
    assert [r.getMessage() for r in caplog.records].count(
        "X-Remote-User from 192.168.0.9, not a trusted proxy: ignored"
    ) == 1  # logged once per address, not once per request
    assert identity.from_proxy("alice,admin", "10.1.2.3") is None  # not a user name


def test_login_names_that_are_not_user_names_never_reach_the_directory():
    ldap = LdapAuthenticator(parse_auth_text(LDAP).ldap)  # type: ignore[arg-type]  # port 1: would fail if asked
    for name in ("*", "*)(uid=*", "alice,ou=x", "a\x00b", "", "x" * 65, "alice)(|(uid=*"):
        assert not valid_login_name(name)
        assert ldap.authenticate(name, "pw") is None
    assert ldap.authenticate("alice", "") is None  # an empty password is an unauthenticated bind: refused


def test_the_directory_down_is_not_a_failure_counted_against_the_user():
    events = []
    identity = Identity(parse_auth_text(LDAP), audit=events.append)
    for _ in range(6):
        assert identity.login("alice", "pw", "10.0.0.1").why == "unavailable"  # nothing listens on port 1
    assert identity.limiter.check("10.0.0.1", "alice").allowed
    assert {e.attrs["why"] for e in events} == {"unavailable"}


def test_ldap_logins_off_loopback_need_tls_or_a_tls_proxy_in_front():
    from hpcwatch.cli.auth import check_auth_exposure

    identity = Identity(parse_auth_text(LDAP))
    check_auth_exposure(identity, "127.0.0.1", tls=False)
    check_auth_exposure(identity, "0.0.0.0", tls=True)
    with pytest.raises(ConfigError, match="would send passwords in clear"):
        check_auth_exposure(identity, "0.0.0.0", tls=False)
    behind_proxy = Identity(parse_auth_text(LDAP + '[session]\nsecure = "always"\n'))
    check_auth_exposure(behind_proxy, "10.0.0.5", tls=False)
    tokens_only = Identity(parse_auth_text('[tokens]\nfile = "t.json"\n'))
    check_auth_exposure(
        tokens_only, "0.0.0.0", tls=False
    )  # allowed (a scrape network may be trusted); deploy.md §14 step 7 says where TLS goes
