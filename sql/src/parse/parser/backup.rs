//! `BACKUP` and `RESTORE`.

use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::Token;

use crate::parse::parser::NyalaParser;
use crate::parse::statement::{object_name, BackupSpec, NyalaStatement, RestoreSpec};
use crate::Result;

impl NyalaParser<'_> {
    /// `BACKUP DATABASE TO 'dir' [INCREMENTAL FROM 'parent']` or `BACKUP TABLE a [, b ...] TO
    /// 'dir' [INCREMENTAL FROM 'parent']`.
    pub(super) fn parse_backup(&mut self) -> Result<NyalaStatement> {
        self.parser.next_token(); // BACKUP
        let tables = match self
            .parser
            .parse_one_of_keywords(&[Keyword::DATABASE, Keyword::TABLE])
        {
            Some(Keyword::DATABASE) => None,
            Some(_) => {
                let mut tables = Vec::new();
                loop {
                    tables.push(object_name(&self.parser.parse_object_name(false)?)?);
                    if !self.parser.consume_token(&Token::Comma) {
                        break;
                    }
                }
                Some(tables)
            }
            None => return Err(self.unexpected("DATABASE or TABLE")),
        };
        self.parser.expect_keyword_is(Keyword::TO)?;
        let path = self.parser.parse_literal_string()?;
        let parent = match self.parse_word("INCREMENTAL") {
            true => {
                self.parser.expect_keyword_is(Keyword::FROM)?;
                Some(self.parser.parse_literal_string()?)
            }
            false => None,
        };
        Ok(NyalaStatement::Backup(BackupSpec {
            tables,
            path,
            parent,
        }))
    }

    /// `RESTORE DATABASE FROM 'dir'` or `RESTORE TABLE t FROM 'dir' [AS new]`.
    pub(super) fn parse_restore(&mut self) -> Result<NyalaStatement> {
        self.parser.next_token(); // RESTORE
        let table = match self
            .parser
            .parse_one_of_keywords(&[Keyword::DATABASE, Keyword::TABLE])
        {
            Some(Keyword::DATABASE) => None,
            Some(_) => Some(object_name(&self.parser.parse_object_name(false)?)?),
            None => return Err(self.unexpected("DATABASE or TABLE")),
        };
        self.parser.expect_keyword_is(Keyword::FROM)?;
        let path = self.parser.parse_literal_string()?;
        let table = match table {
            Some(name) => {
                let restored_as = match self.parser.parse_keyword(Keyword::AS) {
                    true => object_name(&self.parser.parse_object_name(false)?)?,
                    false => name.clone(),
                };
                Some((name, restored_as))
            }
            None => None,
        };
        Ok(NyalaStatement::Restore(RestoreSpec { table, path }))
    }
}
