import pytest
from hypothesis import given
from hypothesis import strategies as st

from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.identity import canonical_locator, validate_key


@pytest.mark.parametrize("bad", [None, "", " a", "a ", "\ta", "a\x00b", "a\nb", "a\u2028b", b"\xff\xfe", "e\u0301",
                                 "x" * 256, 1.5, True])
def test_non_canonical_keys_are_rejected(bad):
    with pytest.raises(InvalidIdentity):
        validate_key(bad)


@pytest.mark.parametrize("good", ["a", "crm-webhooks", "Zoë", "李", "a b", "x" * 255])
def test_canonical_keys_pass_unchanged(good):
    assert validate_key(good) == good


def test_locators_render_integers_and_refuse_floats_and_bools():
    assert canonical_locator(123) == "123"
    assert canonical_locator("abc") == "abc"
    for bad in (1.0, True, " 1"):
        with pytest.raises(InvalidIdentity):
            canonical_locator(bad)


@given(st.text(min_size=1, max_size=40))
def test_validation_never_normalizes(value):
    try:
        assert validate_key(value) == value
    except InvalidIdentity:
        pass
