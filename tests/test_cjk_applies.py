"""cjk_query.applies is the any() over _script it stands for, on every code point."""

from cpersona.services.recall import cjk_query


def test_applies_reads_kana_and_kanji_exactly_as_script_does() -> None:
    # applies() is a regex for speed; _script is the rule content_runs reads the query by.
    differ = [
        hex(point)
        for point in range(0x110000)
        if not 0xD800 <= point < 0xE000 and cjk_query.applies(chr(point)) != (cjk_query._script(chr(point)) in "hkc")
    ]
    assert differ == []
    assert cjk_query.applies("What did Jon say? ジョン") and not cjk_query.applies("café ・ résumé")
