"""A parallel corpus (English → another language) from the gettext catalogs in Debian packages.

Volunteers translate the user-interface strings of free software into dozens of languages; Debian ships them as
compiled gettext catalogs (``.mo``). Each catalog entry is a pair (English ``msgid``, translated ``msgstr``). This
module reads the catalogs straight out of downloaded ``.deb`` files (nothing is installed), cleans the pairs, splits
them into train/dev/test by English source, and writes three TSV files plus ``summary.json``::

    python -m model.corpus build --pair en-ja            # ~/.cache/attnserve/corpus/en-ja/{train,dev,test}.tsv
    python -m model.corpus build --pair en-de --download # fetch missing .debs with apt-get download first

Every TSV row is ``source<TAB>target<TAB>packages`` (packages: comma-joined, sorted names of the Debian packages the
pair came from). The same ``.deb`` files always give byte-identical outputs: everything is sorted and nothing depends
on time or on the iteration order of sets or dicts.

The cleaning functions (:func:`clean_text`, :func:`strip_accelerators`, :func:`keep_pair`, :func:`split_of`, ...) are
pure, so they are unit-tested on hand-written examples.
"""
